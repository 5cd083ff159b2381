#include "io/io_seam.h"

#include <fcntl.h>
#include <unistd.h>

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

int IoSeam::fallocate(int fd, int mode, off_t offset, off_t len) {
  return ::fallocate(fd, mode, offset, len);
}

IoSeam& system_io() {
  // Leaked on purpose, like the thread pool: requests still in flight at exit use it after
  // static destructors have run (tests/reliability/process_test.cc, ExitInFlight).
  static SystemIo* io = new SystemIo;
  return *io;
}

}  // namespace ferry::io
