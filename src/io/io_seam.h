// The one interface through which ferry's POSIX backend makes system calls on files. Production
// code uses system_io(); tests substitute a decorator that injects faults (EIO, EINTR, short
// transfers, ENOSPC). Implementations must be thread-safe.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ferry/route.h"

namespace ferry::io {

// A request's window on a remote source's counters (the route report's source layer): opened
// before its first task, ended after its last.
class SourceWindow {
 public:
  virtual ~SourceWindow() = default;
  virtual void end(SourceCounts& out) = 0;
};

// How the server of a remote object serves byte ranges, as learnt at open (or since).
struct RangeSupport {
  enum class Kind {
    kServed,   // it answers a ranged GET with the range (206)
    kIgnored,  // it answers a ranged GET with the whole object (200)
    kUnknown,  // it has not said (no Accept-Ranges): the next GET's answer tells
  };
  Kind kind = Kind::kUnknown;
  std::string basis;  // how that is known, in words
};

class IoSeam {
 public:
  virtual ~IoSeam() = default;
  // Each returns what the system call returns and sets errno the same way.
  virtual int open(const char* path, int flags, mode_t mode) = 0;
  virtual ssize_t pread(int fd, void* buf, size_t size, off_t offset) = 0;
  virtual ssize_t pwrite(int fd, const void* buf, size_t size, off_t offset) = 0;
  virtual int fstat(int fd, struct stat* st) = 0;
  virtual int fsync(int fd) = 0;
  virtual int close(int fd) = 0;
  // fallocate(2); the seams of tests need not override it.
  virtual int fallocate(int fd, int mode, off_t offset, off_t len);
  // sync_file_range(2); the seams of tests need not override it.
  virtual int sync_file_range(int fd, off_t offset, off_t len, unsigned int flags);
  // A seam of remote objects (src/remote/) counts the GETs of a descriptor it opened; others
  // have no source layer (null).
  virtual std::unique_ptr<SourceWindow> observe_source(int /*fd*/) { return nullptr; }
  // A seam of remote objects says how the server of a descriptor it opened serves ranges; others
  // nothing. Where it ignores them, or has not said, a request's tasks run in order on one
  // worker, so that one GET streams them all.
  virtual std::optional<RangeSupport> range_support(int /*fd*/) { return std::nullopt; }
};

// The real system calls.
IoSeam& system_io();

// The stop flag of the request whose I/O the calling thread is doing now (a task of a request,
// or a File's open), for the length of the scope. A seam whose calls can wait long (remote
// objects: GETs, retry waits) looks at it and gives up with ECANCELED soon after it is set.
class CancelScope {
 public:
  explicit CancelScope(const std::atomic<bool>* flag);
  ~CancelScope();
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

 private:
  const std::atomic<bool>* outer_;
};

// Whether the calling thread's request (CancelScope) has been cancelled; false outside a scope.
bool cancel_requested();
// The calling thread's stop flag (CancelScope), or null outside a scope.
const std::atomic<bool>* cancel_flag();

// Whether `path` names a remote object rather than a file: http://, https:// or s3:// (the scheme
// in any case). Such paths go to the environment's remote seam.
bool is_remote_url(std::string_view path);

// A path or URL as every message, report and output shows it (ferry::shown_path is this): a URL
// (any scheme://) without its query and fragment (where a presigned URL's signature and
// credential lie, shown as "?...") and without user:password@; a local path unchanged.
std::string shown_url(std::string_view url);

// The path of a URL ("/bucket/model.safetensors"), without its host, user:password@, query and
// fragment: what a file's kind is told from. A local path unchanged.
std::string url_path(std::string_view url);

}  // namespace ferry::io
