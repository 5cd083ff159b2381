// Cancelling libcurl's transfers at once. libcurl looks at its progress callback only about once
// a second while nothing arrives (curl_easy_perform polls for up to 1000 ms at a time), so a
// cancelled request would wait up to that long. While a transfer of a cancellable request runs
// (io::CancelScope), one watcher thread per process looks at the request's stop flag every 20 ms
// and, once it is set, shuts down the sockets of the transfer's handle: libcurl's poll wakes at
// once and the transfer fails. Thread-safe; a SocketSet belongs to one handle.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "remote/curl_api.h"

namespace ferry::remote {

#if FERRY_HAVE_CURL
// The sockets a handle has open, kept by libcurl's open and close callbacks (track_sockets). The
// watcher shuts them down under the mutex that closing takes, so never a descriptor number that
// was closed and reused meanwhile.
struct SocketSet {
  std::mutex mu;
  std::vector<curl_socket_t> open;  // under mu
  // In a child made by fork(): a new, empty set in place of `parent`'s, which is left alone
  // (never freed: its mutex may have been held by another of the parent's threads at the fork,
  // and its sockets are the parent's, never to be shut down from here).
  static std::unique_ptr<SocketSet> after_fork(std::unique_ptr<SocketSet> parent);
};

// Has libcurl open and close `handle`'s sockets through `set` (set again after each easy_reset).
void track_sockets(const CurlApi& api, CURL* handle, SocketSet* set);

// A transfer on a handle whose sockets are `set`, watched for as long as this lives when the
// calling thread's request is cancellable (io::cancel_flag()); nothing otherwise.
class Watched {
 public:
  explicit Watched(SocketSet* set);
  ~Watched();
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;

  const std::atomic<bool>* flag() const { return flag_; }
  SocketSet* set() const { return set_; }
  bool shut = false;  // under the watcher's mutex: its sockets were shut down

 private:
  const std::atomic<bool>* flag_;
  SocketSet* set_;
};
#endif

}  // namespace ferry::remote
