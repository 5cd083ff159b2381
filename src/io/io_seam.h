// The one interface through which ferry's POSIX backend makes system calls on files. Production
// code uses system_io(); tests substitute a decorator that injects faults (EIO, EINTR, short
// transfers, ENOSPC). Implementations must be thread-safe.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

namespace ferry::io {

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
};

// The real system calls.
IoSeam& system_io();

}  // namespace ferry::io
