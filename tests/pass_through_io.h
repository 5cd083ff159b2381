// An I/O seam (src/io/io_seam.h) that makes the real system calls: a test derives from it and
// overrides only the calls it watches, slows or breaks.
#pragma once

#include "io/io_seam.h"

namespace ferry::test {

class PassThroughIo : public io::IoSeam {
 public:
  int open(const char* path, int flags, mode_t mode) override {
    return io::system_io().open(path, flags, mode);
  }
  ssize_t pread(int fd, void* buf, size_t size, off_t offset) override {
    return io::system_io().pread(fd, buf, size, offset);
  }
  ssize_t pwrite(int fd, const void* buf, size_t size, off_t offset) override {
    return io::system_io().pwrite(fd, buf, size, offset);
  }
  int fstat(int fd, struct stat* st) override { return io::system_io().fstat(fd, st); }
  int fsync(int fd) override { return io::system_io().fsync(fd); }
  int close(int fd) override { return io::system_io().close(fd); }
};

}  // namespace ferry::test
