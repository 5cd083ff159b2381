// A file descriptor closed when its owner goes: one owner, movable. Not thread-safe.
#pragma once

#include <unistd.h>

namespace ferry::base {

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace ferry::base
