// ScriptedIo: an I/O seam for tests that passes calls to the real system except the faults it is
// told to inject (errno, short or zero transfers, delays, a truncation mid-read), and counts
// what reached the file and what is in flight. Thread-safe: the fields are set before a request
// starts and read after it ends.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <thread>

#include "core/open_file.h"
#include "ferry/file.h"
#include "io/io_seam.h"
#include "test_hooks.h"

namespace ferry::test {

class ScriptedIo final : public io::IoSeam {
 public:
  // A transfer covering `fail_offset` fails with `fail_errno` (every time, or `fail_times`).
  std::int64_t fail_offset = -1;
  int fail_errno = EIO;
  std::atomic<int> fail_times{1 << 30};
  std::atomic<int> transient_left{0};  // the next N transfers fail with `transient_errno`
  int transient_errno = EAGAIN;
  bool zero_writes = false;       // pwrite returns 0 (moves nothing)
  std::int64_t slow_offset = -1;  // a transfer covering it first sleeps `slow`
  std::chrono::milliseconds slow{0};
  std::chrono::microseconds every{0};    // every transfer first sleeps this long
  std::int64_t truncate_at_offset = -1;  // a pread covering it first truncates
  std::filesystem::path truncate_path;   // this file to `truncate_to` bytes (a file cut short
  std::uint64_t truncate_to = 0;         // mid-read by another process)
  int open_errno = 0;                    // open fails with it
  bool refuse_direct = false;            // open with O_DIRECT fails with EINVAL
  int fstat_errno = 0;                   // fstat fails with it
  std::atomic<int> slow_fstats{0};       // the next N fstat calls first sleep `slow`
  int fsync_errno = 0;                   // fsync fails with it
  int close_errno = 0;                   // close (which still closes) reports it
  int fallocate_errno = 0;               // fallocate fails with it
  std::size_t direct_read_cap = 0;  // preads of an O_DIRECT descriptor move at most this (0: all),
                                    // as NFS or FUSE may return short counts before end of file
  std::int64_t stat_size = -1;      // fstat reports this size (-1: the real one); a sysfs attribute
                                    // reports 4096 B and holds fewer

  std::atomic<int> calls{0};
  std::atomic<int> in_flight{0};
  std::atomic<std::uint64_t> bytes_written{0};
  std::atomic<int> opens{0};
  std::atomic<int> closes{0};
  std::atomic<int> fallocates{0};           // calls of fallocate, failed ones too
  std::atomic<std::int64_t> fallocated{0};  // bytes the last call was asked for

  int open(const char* path, int flags, mode_t mode) override {
    if (open_errno != 0 || (refuse_direct && (flags & O_DIRECT) != 0)) {
      errno = open_errno != 0 ? open_errno : EINVAL;
      return -1;
    }
    int fd = io::system_io().open(path, flags, mode);
    if (fd >= 0) opens.fetch_add(1);
    return fd;
  }
  ssize_t pread(int fd, void* buf, size_t size, off_t offset) override {
    Scope scope(*this);
    if (covers(truncate_at_offset, size, offset)) {
      if (::truncate(truncate_path.c_str(), static_cast<off_t>(truncate_to)) != 0) return -1;
    }
    if (ssize_t r = fault(size, offset); r != 0) return r;
    ssize_t n = io::system_io().pread(fd, buf, size, offset);
    if (direct_read_cap > 0 && n > static_cast<ssize_t>(direct_read_cap) &&
        (fcntl(fd, F_GETFL) & O_DIRECT) != 0) {
      n = static_cast<ssize_t>(direct_read_cap);  // the rest arrived, but is not reported
    }
    return n;
  }
  ssize_t pwrite(int fd, const void* buf, size_t size, off_t offset) override {
    Scope scope(*this);
    if (ssize_t r = fault(size, offset); r != 0) return r;
    if (zero_writes) return 0;
    ssize_t n = io::system_io().pwrite(fd, buf, size, offset);
    if (n > 0) bytes_written.fetch_add(static_cast<std::uint64_t>(n));
    return n;
  }
  int fstat(int fd, struct stat* st) override {
    if (slow_fstats.fetch_sub(1) > 0) std::this_thread::sleep_for(slow);
    if (fstat_errno != 0) {
      errno = fstat_errno;
      return -1;
    }
    const int r = io::system_io().fstat(fd, st);
    if (r == 0 && stat_size >= 0) st->st_size = static_cast<off_t>(stat_size);
    return r;
  }
  int fsync(int fd) override {
    if (fsync_errno != 0) {
      errno = fsync_errno;
      return -1;
    }
    return io::system_io().fsync(fd);
  }
  int fallocate(int fd, int mode, off_t offset, off_t len) override {
    fallocates.fetch_add(1);
    fallocated = len;
    if (fallocate_errno != 0) {
      errno = fallocate_errno;
      return -1;
    }
    return io::system_io().fallocate(fd, mode, offset, len);
  }
  int close(int fd) override {
    closes.fetch_add(1);
    int r = io::system_io().close(fd);
    if (r == 0 && close_errno != 0) {
      errno = close_errno;
      return -1;
    }
    return r;
  }

 private:
  struct Scope {
    explicit Scope(ScriptedIo& io) : io_(io) {
      io_.calls.fetch_add(1);
      io_.in_flight.fetch_add(1);
    }
    ~Scope() { io_.in_flight.fetch_sub(1); }
    ScriptedIo& io_;
  };

  static bool covers(std::int64_t at, size_t size, off_t offset) {
    return at >= offset && at < offset + static_cast<off_t>(size);
  }

  ssize_t fault(size_t size, off_t offset) {
    if (covers(slow_offset, size, offset)) std::this_thread::sleep_for(slow);
    if (every.count() > 0) std::this_thread::sleep_for(every);
    if (transient_left.fetch_sub(1) > 0) {
      errno = transient_errno;
      return -1;
    }
    if (covers(fail_offset, size, offset) && fail_times.fetch_sub(1) > 0) {
      errno = fail_errno;
      return -1;
    }
    return 0;
  }
};

// A File whose system calls go through `io`, with small tasks so that requests have many, on
// `runtime` (null: the default one).
inline File open_scripted(ScriptedIo& io, const std::filesystem::path& path, const char* mode,
                          const char* task_size = "64KiB", const char* nthreads = "4",
                          bool direct = false, Runtime* runtime = nullptr) {
  FileOptions options;
  options.direct = direct;
  options.runtime = runtime;
  options.settings.set("task_size", task_size);
  options.settings.set("nthreads", nthreads);
  options.settings.set("host_nthreads", nthreads);  // these files are read into host memory
  return test::FileTestHelper::open(path, mode, options, io);
}

}  // namespace ferry::test
