#include "io/page_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "ferry/error.h"

namespace ferry::io {
namespace {

// cachestat(2), Linux 6.5; the same number on every architecture that uses the generic table.
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif

struct CachestatRange {
  std::uint64_t off;
  std::uint64_t len;
};
struct Cachestat {
  std::uint64_t nr_cache;
  std::uint64_t nr_dirty;
  std::uint64_t nr_writeback;
  std::uint64_t nr_evicted;
  std::uint64_t nr_recently_evicted;
};

// -1 unknown, 0 absent (ENOSYS or blocked by a seccomp filter), 1 present. Process-wide: the
// kernel and the seccomp filter are the process's.
std::atomic<int> cachestat_works{-1};

std::uint64_t page_size() {
  static const std::uint64_t size =  // the machine's: asked once
      static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// Pages of [first, last) page range counted by cachestat; false when the call is unusable.
bool by_cachestat(int fd, std::uint64_t first, std::uint64_t last, std::uint64_t* pages) {
  if (cachestat_works.load(std::memory_order_relaxed) == 0) return false;
  CachestatRange range{first * page_size(), (last - first) * page_size()};
  Cachestat cs{};
  if (syscall(__NR_cachestat, fd, &range, &cs, 0) != 0) {
    if (errno == ENOSYS || errno == EPERM) cachestat_works.store(0, std::memory_order_relaxed);
    return false;
  }
  cachestat_works.store(1, std::memory_order_relaxed);
  *pages = cs.nr_cache;
  return true;
}

// Resident pages of [first, last) by mincore on a temporary mapping; -1 with errno on failure.
long long by_mincore(int fd, std::uint64_t first, std::uint64_t last) {
  const std::uint64_t n = last - first;
  void* map = mmap(nullptr, n * page_size(), PROT_READ, MAP_SHARED, fd,
                   static_cast<off_t>(first * page_size()));
  if (map == MAP_FAILED) return -1;
  std::vector<unsigned char> vec(n);
  long long count = -1;
  if (mincore(map, n * page_size(), vec.data()) == 0) {
    count = 0;
    for (unsigned char v : vec) count += v & 1;
  }
  int saved = errno;
  munmap(map, n * page_size());
  errno = saved;
  return count;
}

}  // namespace

PageCacheResidency measure_residency(int fd, std::uint64_t offset, std::uint64_t len,
                                     Residency how) {
  PageCacheResidency r;
  r.bytes = len;
  if (len == 0) {
    r.known = true;
    r.method = "empty range";
    return r;
  }
  const std::uint64_t ps = page_size();
  const std::uint64_t first = offset / ps;
  const std::uint64_t last = (offset + len + ps - 1) / ps;
  const std::uint64_t span = (last - first) * ps;  // whole pages covering the range
  std::uint64_t pages = 0;
  auto mincore_failed = [&r] {
    r.why_not = fmt::format("cachestat unavailable and mincore failed: {}", std::strerror(errno));
    return r;
  };
  if (by_cachestat(fd, first, last, &pages)) {
    r.known = true;
    r.method = "cachestat";
  } else if (span <= kMincoreExact || how == Residency::kExact) {
    // A window at a time, so that a large file is never mapped whole.
    constexpr std::uint64_t kWindowBytes = std::uint64_t{1} << 30;
    const std::uint64_t window = std::max<std::uint64_t>(kWindowBytes / ps, 1);
    for (std::uint64_t start = first; start < last; start += window) {
      long long n = by_mincore(fd, start, std::min(last, start + window));
      if (n < 0) return mincore_failed();
      pages += static_cast<std::uint64_t>(n);
    }
    r.known = true;
    r.method = "mincore";
  } else {
    // Sample 64 evenly spaced windows of 1 MiB: at most 16384 pages looked up.
    constexpr std::uint64_t kSamples = 64;
    const std::uint64_t window =
        std::min<std::uint64_t>((std::uint64_t{1} << 20) / ps, last - first);
    std::uint64_t seen = 0, hit = 0;
    for (std::uint64_t i = 0; i < kSamples; ++i) {
      std::uint64_t start = first + (last - first - window) * i / (kSamples - 1);
      long long n = by_mincore(fd, start, start + window);
      if (n < 0) return mincore_failed();
      hit += static_cast<std::uint64_t>(n);
      seen += window;
    }
    pages = (last - first) * hit / seen;
    r.known = true;
    r.estimated = true;
    r.method = "mincore";
  }
  // Pages are whole; the range may start and end inside one.
  r.resident = std::min<std::uint64_t>(pages * ps, len);
  if (pages == last - first) r.resident = len;
  return r;
}

}  // namespace ferry::io

namespace ferry {

PageCacheResidency page_cache_residency(int fd, std::uint64_t offset,
                                        std::optional<std::uint64_t> length, Residency how) {
  if (!length) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      PageCacheResidency r;
      r.why_not = fmt::format("fstat of descriptor {}: {}", fd, std::strerror(errno));
      return r;
    }
    const auto size = static_cast<std::uint64_t>(st.st_size);
    length = size > offset ? size - offset : 0;
  }
  return io::measure_residency(fd, offset, *length, how);
}

PageCacheResidency page_cache_residency(const std::string& path, std::uint64_t offset,
                                        std::optional<std::uint64_t> length, Residency how) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw IoError(errno, "open (to measure page-cache residency)", path, offset,
                  length.value_or(0));
  }
  PageCacheResidency r = page_cache_residency(fd, offset, length, how);
  ::close(fd);
  return r;
}

}  // namespace ferry
