// What a process's first GPU read pays before its first byte moves, one primitive at a time:
// loading libcuda, the primary context, pinned staging buffers (several sizes and ways), streams,
// events and threads, and how fast copies of small and large chunks run once they exist. Run in
// a fresh process; prints one JSON object per measurement (stdout) and a table (stderr).
// With --ceilings FILE it instead measures the two ceilings a read can reach, best of 3: a
// pinned host-to-device copy in 4 MiB chunks, and the page cache into touched host memory by 16
// threads of 4 MiB preads (FILE must be in the page cache).
// Usage: ferry_startup_probe [--ceilings FILE]   (exits 77 with the reason where there is no GPU)
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "cuda/cuda_driver.h"

namespace {

using ferry::bench::Clock;
using ferry::bench::since;
namespace cu = ferry::cuda;

void report(const std::string& what, double seconds, const std::string& note = "") {
  nlohmann::json j = {{"case", what}, {"ms", seconds * 1e3}};
  if (!note.empty()) j["note"] = note;
  fmt::print("{}\n", j.dump());
  fmt::print(stderr, "{:<58} {:>9.3f} ms {}\n", what, seconds * 1e3, note);
}

// Page cache -> host memory by `threads` threads of 4 MiB preads into a touched buffer.
double page_cache_ceiling(const char* path, int threads) {
  int fd = ::open(path, O_RDONLY);
  if (fd < 0) throw std::runtime_error(fmt::format("open {}: {}", path, std::strerror(errno)));
  struct stat st {};
  fstat(fd, &st);
  const std::size_t size = static_cast<std::size_t>(st.st_size), chunk = std::size_t{4} << 20;
  std::vector<char> buf(size);
  std::memset(buf.data(), 1, size);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::atomic<std::size_t> next{0};
    auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        for (std::size_t off; (off = next.fetch_add(chunk)) < size;) {
          std::size_t len = std::min(chunk, size - off);
          if (::pread(fd, buf.data() + off, len, static_cast<off_t>(off)) < 0) std::abort();
        }
      });
    }
    for (auto& th : pool) th.join();
    best = std::max(best, size / since(t0) / 1e9);
  }
  ::close(fd);
  return best;
}

int ceilings(const char* path) {
  std::string why;
  const cu::Driver* d = cu::driver_or_null(&why);
  if (d != nullptr) {
    cu::use_device(0);
    const std::size_t size = std::size_t{1} << 30, chunk = std::size_t{4} << 20;
    void* host = nullptr;
    cu::abi::DevicePtr dev = 0;
    cu::abi::Stream stream = nullptr;
    cu::check(d->MemHostAlloc(&host, chunk, cu::abi::kMemHostAllocPortable), "cuMemHostAlloc");
    cu::check(d->MemAlloc(&dev, size), "cuMemAlloc");
    cu::check(d->StreamCreate(&stream, cu::abi::kStreamNonBlocking), "cuStreamCreate");
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = Clock::now();
      for (std::size_t off = 0; off < size; off += chunk)
        cu::check(d->MemcpyHtoDAsync(dev + off, host, chunk, stream), "cuMemcpyHtoDAsync");
      cu::check(d->StreamSynchronize(stream), "cuStreamSynchronize");
      best = std::max(best, size / since(t0) / 1e9);
    }
    fmt::print("{}\n", nlohmann::json{{"case", "ceiling_pinned_htod"}, {"gbps", best}}.dump());
  } else {
    fmt::print(stderr, "no GPU ceiling: {}\n", why);
  }
  const double pc = page_cache_ceiling(path, 16);
  fmt::print("{}\n",
             nlohmann::json{{"case", "ceiling_page_cache_to_host_16t"}, {"gbps", pc}}.dump());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--ceilings") return ceilings(argv[2]);
  auto t0 = Clock::now();
  std::string why;
  const cu::Driver* d = cu::driver_or_null(&why);
  if (d == nullptr) {
    fmt::print(stderr, "skipped: {}\n", why);
    return 77;
  }
  report("dlopen libcuda + cuInit", since(t0));
  t0 = Clock::now();
  cu::use_device(0);
  report("primary context retain + set current (GPU 0)", since(t0));

  constexpr std::size_t kMiB = std::size_t{1} << 20;
  std::vector<void*> to_free;
  for (std::size_t mib : {1, 4, 4, 16, 64}) {
    void* p = nullptr;
    t0 = Clock::now();
    cu::check(d->MemHostAlloc(&p, mib * kMiB, cu::abi::kMemHostAllocPortable), "cuMemHostAlloc");
    report(fmt::format("cuMemHostAlloc {} MiB", mib), since(t0));
    to_free.push_back(p);
  }
  // 16 slots of 4 MiB (8 workers x 2), from one thread, then from 8 threads at once.
  t0 = Clock::now();
  for (int i = 0; i < 16; ++i) {
    void* p = nullptr;
    cu::check(d->MemHostAlloc(&p, 4 * kMiB, cu::abi::kMemHostAllocPortable), "cuMemHostAlloc");
    to_free.push_back(p);
  }
  report("16 x cuMemHostAlloc 4 MiB, one thread", since(t0));
  {
    std::vector<void*> ptrs(16, nullptr);
    t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        cu::use_device(0);
        for (int k = 0; k < 2; ++k)
          cu::check(d->MemHostAlloc(&ptrs[t * 2 + k], 4 * kMiB, cu::abi::kMemHostAllocPortable),
                    "cuMemHostAlloc");
      });
    }
    for (auto& th : threads) th.join();
    report("16 x cuMemHostAlloc 4 MiB, 8 threads at once (incl. thread start)", since(t0));
    for (void* p : ptrs) to_free.push_back(p);
  }
  // Registering ordinary memory instead: touched 4 KiB pages, and transparent huge pages.
  for (bool huge : {false, true}) {
    const std::size_t size = 64 * kMiB;
    t0 = Clock::now();
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (huge) madvise(p, size, MADV_HUGEPAGE);
    std::memset(p, 0, size);
    const double touched = since(t0);
    cu::check(d->MemHostRegister(p, size, cu::abi::kMemHostRegisterPortable), "cuMemHostRegister");
    report(fmt::format("mmap+touch+cuMemHostRegister 64 MiB{}", huge ? " (MADV_HUGEPAGE)" : ""),
           since(t0), fmt::format("touch {:.3f} ms", touched * 1e3));
  }
  t0 = Clock::now();
  std::vector<cu::abi::Stream> streams(8);
  for (auto& s : streams)
    cu::check(d->StreamCreate(&s, cu::abi::kStreamNonBlocking), "cuStreamCreate");
  report("8 x cuStreamCreate", since(t0));
  t0 = Clock::now();
  std::vector<cu::abi::Event> events(16);
  for (auto& e : events)
    cu::check(d->EventCreate(&e, cu::abi::kEventDisableTiming), "cuEventCreate");
  report("16 x cuEventCreate", since(t0));
  t0 = Clock::now();
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) threads.emplace_back([] {});
    for (auto& th : threads) th.join();
  }
  report("8 x std::thread start + join", since(t0));

  // Copy rate by chunk size from one pinned buffer, one stream, 1 GiB in all.
  cu::abi::DevicePtr dev = 0;
  t0 = Clock::now();
  cu::check(d->MemAlloc(&dev, std::size_t{1} << 30), "cuMemAlloc");
  report("cuMemAlloc 1 GiB", since(t0));
  char* src = static_cast<char*>(to_free.back());
  for (std::size_t chunk : {256 * 1024UL, 1 * kMiB, 4 * kMiB}) {
    for (int rep = 0; rep < 2; ++rep) {
      t0 = Clock::now();
      for (std::size_t off = 0; off < (std::size_t{1} << 30); off += chunk)
        cu::check(d->MemcpyHtoDAsync(dev + off, src, chunk, streams[0]), "cuMemcpyHtoDAsync");
      cu::check(d->StreamSynchronize(streams[0]), "cuStreamSynchronize");
      const double s = since(t0);
      report(fmt::format("HtoD 1 GiB in {} KiB copies (run {})", chunk / 1024, rep + 1), s,
             fmt::format("{:.1f} GB/s", (1 << 30) / s / 1e9));
    }
  }
  return 0;
}
