#include "io/io_seam.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <string>

namespace ferry::io {
namespace {

class SystemIo final : public IoSeam {
 public:
  int open(const char* path, int flags, mode_t mode) override {
    return ::open(path, flags | O_CLOEXEC, mode);
  }
  ssize_t pread(int fd, void* buf, size_t size, off_t offset) override {
    return ::pread(fd, buf, size, offset);
  }
  ssize_t pwrite(int fd, const void* buf, size_t size, off_t offset) override {
    return ::pwrite(fd, buf, size, offset);
  }
  int fstat(int fd, struct stat* st) override { return ::fstat(fd, st); }
  int fsync(int fd) override { return ::fsync(fd); }
  int close(int fd) override { return ::close(fd); }
};

}  // namespace

namespace {
thread_local const std::atomic<bool>* current_cancel = nullptr;
}  // namespace

CancelScope::CancelScope(const std::atomic<bool>* flag) : outer_(current_cancel) {
  current_cancel = flag;
}
CancelScope::~CancelScope() { current_cancel = outer_; }

const std::atomic<bool>* cancel_flag() { return current_cancel; }

bool cancel_requested() {
  return current_cancel != nullptr && current_cancel->load(std::memory_order_relaxed);
}

bool is_remote_url(std::string_view path) {
  auto scheme = [path](std::string_view prefix) {
    if (path.size() < prefix.size()) return false;
    for (std::size_t i = 0; i < prefix.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(path[i])) != prefix[i]) return false;
    }
    return true;
  };
  return scheme("http://") || scheme("https://") || scheme("s3://");
}

std::string shown_url(std::string_view url) {
  std::string_view s = url.substr(0, url.find_first_of("?#"));
  const bool cut = s.size() < url.size();
  // user:password@host
  std::size_t scheme = s.find("://");
  if (scheme != std::string_view::npos) {
    std::size_t host = scheme + 3;
    std::size_t slash = s.find('/', host);
    std::size_t at = s.substr(0, slash).rfind('@');
    if (at != std::string_view::npos && at >= host) {
      return fmt::format("{}{}{}", s.substr(0, host), s.substr(at + 1), cut ? "?..." : "");
    }
  }
  return fmt::format("{}{}", s, cut ? "?..." : "");
}

int IoSeam::fallocate(int fd, int mode, off_t offset, off_t len) {
  return ::fallocate(fd, mode, offset, len);
}

int IoSeam::sync_file_range(int fd, off_t offset, off_t len, unsigned int flags) {
  return ::sync_file_range(fd, offset, len, flags);
}

IoSeam& system_io() {
  // Leaked on purpose, like the thread pool: requests still in flight at exit use it after
  // static destructors have run (tests/reliability/process_test.cc, ExitInFlight).
  static SystemIo* io = new SystemIo;
  return *io;
}

}  // namespace ferry::io
