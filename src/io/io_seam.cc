#include "io/io_seam.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "base/text.h"
#include "ferry/remote.h"

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
// Per thread by design: the cancel flag of the request this thread runs a task of now.
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
  return base::starts_with_nocase(path, "http://") || base::starts_with_nocase(path, "https://") ||
         base::starts_with_nocase(path, "s3://");
}

std::string shown_url(std::string_view url) {
  // Any scheme://, not only ferry's: a URL ferry refuses (ftp://user:pw@host/x) is still named
  // in the error. A local path never starts so.
  const std::size_t scheme = url.find("://");
  const bool has_scheme =
      scheme != std::string_view::npos && scheme > 0 &&
      std::isalpha(static_cast<unsigned char>(url[0])) &&
      std::all_of(url.begin(), url.begin() + scheme, [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
      });
  if (!has_scheme) return std::string(url);
  const std::size_t host = scheme + 3;
  // user:password@ goes wherever an '@' lies before the path's first '/', even after a '?' or
  // '#': a password holding one of those would otherwise be cut there and its start shown.
  const std::size_t slash = url.find('/', host);
  const std::size_t at = url.substr(0, slash).rfind('@');
  std::string_view rest = url.substr(at == std::string_view::npos ? host : at + 1);
  // The query and fragment go whole: a presigned URL's X-Amz-Signature, X-Amz-Credential and
  // X-Amz-Security-Token, Azure's sig=, CloudFront's Signature=, any token= live there.
  const std::size_t query = rest.find_first_of("?#");
  return fmt::format("{}{}{}", url.substr(0, host), rest.substr(0, query),
                     query == std::string_view::npos ? "" : "?...");
}

std::string url_path(std::string_view url) {
  if (!is_remote_url(url)) return std::string(url);
  std::string shown = shown_url(url);
  if (shown.ends_with("?...")) shown.resize(shown.size() - 4);
  const std::size_t slash = shown.find('/', shown.find("://") + 3);
  return slash == std::string::npos ? std::string() : shown.substr(slash);
}

int IoSeam::fallocate(int fd, int mode, off_t offset, off_t len) {
  return ::fallocate(fd, mode, offset, len);
}

int IoSeam::sync_file_range(int fd, off_t offset, off_t len, unsigned int flags) {
  return ::sync_file_range(fd, offset, len, flags);
}

IoSeam& system_io() {
  // Process-wide: the system's calls are the process's (default_environment() hands it to every
  // runtime). Leaked on purpose, like the thread pool: requests still in flight at exit use it
  // after static destructors have run (tests/reliability/process_test.cc, ExitInFlight).
  static SystemIo* io = new SystemIo;
  return *io;
}

}  // namespace ferry::io

namespace ferry {

std::string shown_path(std::string_view path) { return io::shown_url(path); }

bool is_remote_url(std::string_view path) { return io::is_remote_url(path); }

}  // namespace ferry
