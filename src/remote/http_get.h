// One HTTP request of a remote source on the calling thread's libcurl handle (kept alive across
// requests, so its connection is reused): a ranged GET that lands bytes in a caller's buffer only
// once the answer is checked (206 with the Content-Range asked for, or 200 with the whole object,
// whose bytes before the range are received and discarded), or a HEAD; and ObjectStream, one GET
// read in order across calls, for servers that ignore Range. Never retries: remote_seam.cc
// decides that. One thread per call; an ObjectStream is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "remote/curl_api.h"
#include "remote/remote_url.h"

namespace ferry::remote {

// How long a transfer may take before it is given up (each attempt; retries are counted apart).
struct Timeouts {
  long connect_ms = 10'000;
  long stall_seconds = 30;   // no byte received for this long: CURLE_OPERATION_TIMEDOUT
  long request_seconds = 0;  // the whole request took this long (0: no bound): the same
};

struct HttpAnswer {
  bool transport_ok = false;    // a complete HTTP answer was received
  int curl_code = 0;            // CURLcode; 0 when transport_ok
  std::string transport_error;  // curl's words where !transport_ok
  long status = 0;
  std::uint64_t length = 0;   // HEAD: Content-Length (the probe: the size it learnt)
  bool length_known = false;  // HEAD: the answer said its length
  std::uint64_t total = 0;    // a 206's Content-Range total (the object's size)
  std::string etag;
  std::string retry_after;
  std::string location;    // a redirect libcurl did not follow (a signed request's): where to
  std::string body;        // an error answer's first 16 KiB
  std::size_t landed = 0;  // GET: bytes written to the buffer
  std::string refused;     // GET: why the answer was refused before a byte landed
  long new_connections = 0;
  std::string accept_ranges;  // HEAD and the probe: the Accept-Ranges header ("bytes", "none")
  // GET: the server answered 200 with the whole object to a range that was not all of it (it
  // ignores Range): the range was cut out of that body, `discarded` bytes received before it.
  bool whole_object = false;
  std::uint64_t discarded = 0;
  bool new_get = false;  // ObjectStream::read: a GET was sent (not only more of an open one)
};

// HEAD `target` (or, with `probe_range`, GET bytes=0-0: a presigned URL signs one method).
HttpAnswer http_head(const CurlApi& api, const RemoteTarget& target, const Timeouts& timeouts,
                     bool probe_range);

// GET [offset, offset + size) of an object of `object_size` bytes whose ETag is `etag` (sent as
// If-Match where not empty) into `buffer`.
HttpAnswer http_get_range(const CurlApi& api, const RemoteTarget& target, const Timeouts& timeouts,
                          std::uint64_t object_size, const std::string& etag, char* buffer,
                          std::uint64_t offset, std::size_t size);

// A GET of one object read in order by successive calls: for a server that ignores Range, where
// each ranged GET would bring the whole object, a read of N tasks costs one GET instead of N.
// read() takes its bytes from the GET already open where it is at or before `offset` (the bytes
// between are received and discarded), else sends a new one for bytes offset to the object's
// end (answered 206 from offset, or 200 from byte 0), checked as http_get_range checks its answers
// (the status, Content-Range, Content-Length against `object_size`, the ETag). Where libcurl's
// own transfer must take the GET (a redirect, a chunked body, a proxy, a signed request where
// libcrypto is absent), it cannot be kept open between calls: that call is one http_get_range.
// Any failure closes it.
class ObjectStream {
 public:
  ObjectStream();
  ~ObjectStream();
  ObjectStream(const ObjectStream&) = delete;
  ObjectStream& operator=(const ObjectStream&) = delete;

  HttpAnswer read(const CurlApi& api, const RemoteTarget& target, const Timeouts& timeouts,
                  std::uint64_t object_size, const std::string& etag, char* buffer,
                  std::uint64_t offset, std::size_t size);
  bool is_open() const;
  std::uint64_t position() const;  // the object's next byte the open GET gives
  void close();                    // ends the GET (its connection is closed: the body is cut)

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ferry::remote
