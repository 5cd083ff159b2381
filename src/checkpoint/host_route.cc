#include "checkpoint/host_route.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "io/io_seam.h"
#include "io/page_cache.h"

namespace ferry {

FileMapping::FileMapping(int fd, std::uint64_t offset, std::uint64_t size, std::string file)
    : offset_(offset), size_(size), file_(std::move(file)) {
  // Private and writable: a write copies the page (copy-on-write) and never reaches the file,
  // and frameworks can wrap the memory without a read-only copy (torch.frombuffer warns on one).
  void* p =
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) throw IoError(errno, "mmap (MAP_PRIVATE)", file_, offset, size);
  data_ = p;
}

FileMapping::~FileMapping() { ::munmap(data_, size_); }

}  // namespace ferry

namespace ferry::checkpoint {
namespace {

// MADV_POPULATE_READ (Linux 5.14), which older C library headers lack.
constexpr int kPopulateRead = 22;
constexpr std::size_t kPage = 4096;  // the smallest page: a read of each touches every page

}  // namespace

HostRoute decide_host_route(HostLoad mode, bool remote, bool direct,
                            const PageCacheResidency& residency) {
  HostRoute r;
  r.page_cache = residency;
  auto read = [&](std::string why) {
    r.path = "read";
    r.reason = std::move(why);
    return r;
  };
  if (mode == HostLoad::kRead) return read("host_load=read");
  if (remote) {
    return read(mode == HostLoad::kMap
                    ? "host_load=map, but a remote object cannot be mapped: ranged GETs"
                    : "a remote object: ranged GETs");
  }
  r.path = "mapped";
  if (mode == HostLoad::kMap) {
    r.reason = "host_load=map: tensors are views of a private mapping";
    return r;
  }
  if (direct) return read("direct=true asks for O_DIRECT reads (host_load=map maps anyway)");
  if (residency.known && residency.fraction() >= kMapResident) {
    r.reason =
        fmt::format("resident in the page cache ({}): tensors are views of a private mapping",
                    describe(residency));
    return r;
  }
  // Cold: parallel faults into the mapping outran both ferry's read into fresh memory (whose
  // every page the kernel zeroes first) and one thread's faults (bench/NOTES.md §31, round 2).
  r.path = "populated";
  r.reason = fmt::format(
      "{} ({}): tensors are views of a private mapping, read in by parallel faults before the "
      "load returns",
      residency.known ? "not resident in the page cache" : "residency unknown",
      residency.known ? describe(residency) : residency.why_not);
  return r;
}

MappedShard route_shard(HostLoad mode, bool direct, const std::string& name,
                        const std::filesystem::path& path, std::uint64_t size, std::uint64_t begin,
                        std::uint64_t end) {
  const bool remote = io::is_remote_url(path.string());
  if (mode == HostLoad::kRead || remote) {
    MappedShard out{decide_host_route(mode, remote, direct, {}), nullptr};
    out.route.file = name;
    return out;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(errno, "open (to map)", name, begin, end - begin);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw IoError(errno, "fstat (to map)", name, begin, end - begin);
  if (static_cast<std::uint64_t>(st.st_size) != size) {
    throw CheckpointError(
        name, "",
        fmt::format("it is {} B now but was {} B when its header was read", st.st_size, size));
  }
  MappedShard out{
      decide_host_route(mode, false, direct, io::measure_residency(fd, begin, end - begin)),
      nullptr};
  out.route.file = name;
  if (out.route.path == "read") return out;
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const std::uint64_t first = begin / page * page;
  try {
    out.mapping = std::make_shared<const FileMapping>(fd, first, end - first, name);
  } catch (const IoError& e) {
    // A file system without mmap, or an address space too small (RLIMIT_AS): the read needs
    // neither.
    out.route.path = "read";
    out.route.reason = fmt::format("{}, but the mapping failed ({}): read instead",
                                   out.route.reason.substr(0, out.route.reason.rfind(": ")),
                                   std::strerror(e.error_code()));
    return out;
  }
  // Linux before 5.14 has no MADV_POPULATE_READ: its first page tells (and is read in).
  if (out.route.path == "populated" && ::madvise(out.mapping->data(), page, kPopulateRead) != 0 &&
      errno == EINVAL) {
    out.route.path = "mapped";
    out.route.reason = out.route.reason.substr(0, out.route.reason.rfind(", read in")) +
                       "; this kernel cannot populate it (no MADV_POPULATE_READ, Linux 5.14): "
                       "left to fault in on first touch";
  }
  return out;
}

void populate(const std::vector<const FileMapping*>& mappings, std::size_t nthreads,
              std::size_t chunk, const std::function<void(std::uint64_t)>& progress) {
  struct Piece {
    const FileMapping* mapping;
    std::uint64_t at;  // in the mapping
    std::size_t size;
  };
  std::vector<Piece> pieces;
  for (const FileMapping* m : mappings) {
    for (std::uint64_t at = 0; at < m->size(); at += chunk) {
      pieces.push_back(
          {m, at, static_cast<std::size_t>(std::min<std::uint64_t>(chunk, m->size() - at))});
    }
  }
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> done{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::size_t finished = 0;  // threads, under mu
  std::exception_ptr failure;
  auto work = [&] {
    struct Finish {
      std::mutex& mu;
      std::condition_variable& cv;
      std::size_t& finished;
      ~Finish() {
        std::lock_guard lock(mu);
        ++finished;
        cv.notify_all();
      }
    } finish{mu, cv, finished};
    while (!stop.load(std::memory_order_relaxed)) {
      const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= pieces.size()) return;
      const Piece& p = pieces[i];
      char* data = static_cast<char*>(p.mapping->data()) + p.at;
      ::madvise(data, p.size, MADV_WILLNEED);  // advice: its failure leaves the faults to read
      int rc;
      while ((rc = ::madvise(data, p.size, kPopulateRead)) != 0 &&
             (errno == EINTR || errno == EAGAIN)) {
      }
      if (rc != 0) {
        const int err = errno;
        std::lock_guard lock(mu);
        if (!failure) {
          failure = std::make_exception_ptr(IoError(
              err, "madvise(MADV_POPULATE_READ)", p.mapping->file(), p.mapping->offset() + p.at,
              p.size, done.load(),
              err == EFAULT ? fmt::format("{}: the file is shorter than when the load began",
                                          std::strerror(err))
                            : ""));
        }
        stop = true;
        return;
      }
      // A read of each page too: where the first access to a page costs more than its page table
      // entry (on the 2-core CPU machine's VM, the hypervisor's own fault: 2.5 to 4.5 s for 2 GB
      // touched after populating, bench/NOTES.md §31 round 2), it is paid here in parallel rather
      // than by the caller's first pass, one page at a time.
      for (std::size_t at = 0; at < p.size; at += kPage) {
        (void)static_cast<const volatile char*>(data)[at];
      }
      done.fetch_add(p.size, std::memory_order_relaxed);
    }
  };
  std::vector<std::jthread> threads;
  const std::size_t n = std::min(std::max<std::size_t>(nthreads, 1), pieces.size());
  for (std::size_t t = 0; t < n; ++t) threads.emplace_back(work);
  try {
    for (;;) {
      {
        std::unique_lock lock(mu);
        if (cv.wait_for(lock, std::chrono::milliseconds(10), [&] { return finished == n; })) {
          break;
        }
      }
      progress(done.load());
    }
  } catch (...) {
    stop = true;
    throw;  // the jthreads join first
  }
  threads.clear();
  if (failure) std::rethrow_exception(failure);
}

bool viewable_in_place(const TensorInfo& t) {
  const unsigned bytes = dtype_bits(t.dtype) / 8;
  return bytes <= 1 || t.file_offset % bytes == 0;
}

}  // namespace ferry::checkpoint
