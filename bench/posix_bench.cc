// ferry's POSIX path against the baselines of issue 2, in one run on one file:
//   - ferry read into GPU memory (default settings, then a small sweep of threads and bounce size);
//   - one thread: pread into a pinned buffer, then a synchronous copy to the GPU;
//   - KvikIO's algorithm: N threads, each pread into its pinned buffer then a synchronous copy;
//   - the pinned host-to-device copy ceiling;
//   - cold reads with O_DIRECT (ferry --direct against raw O_DIRECT pread by N threads);
//   - writes from GPU memory (ferry against one thread of copy + pwrite).
// Prints one JSON object per case (to stdout) and a table of ratios (to stderr).
// Uses the internal libcuda loader for the baselines so both sides share one driver.
#include <fcntl.h>
#include <ferry/ferry.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_driver.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace abi = ferry::cuda::abi;
constexpr std::size_t kChunk = std::size_t{4} << 20;

double cpu_now() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec / 1e6;
}

struct Result {
  std::string name;
  double seconds = 1e30;  // best of the repeats
  double cpu = 0;         // CPU seconds of the best repeat
  std::uint64_t bytes = 0;
  double gbps() const { return bytes / seconds / 1e9; }
  double cpu_per_gib() const { return cpu / (static_cast<double>(bytes) / (1 << 30)); }
};

Result measure(const std::string& name, std::uint64_t bytes, int repeat,
               const std::function<void()>& body) {
  Result r{name, 1e30, 0, bytes};
  for (int i = 0; i < repeat; ++i) {
    double c0 = cpu_now();
    auto t0 = Clock::now();
    body();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    double c = cpu_now() - c0;
    if (s < r.seconds) {
      r.seconds = s;
      r.cpu = c;
    }
  }
  nlohmann::json j = {{"case", name},
                      {"bytes", bytes},
                      {"seconds", r.seconds},
                      {"gbps", r.gbps()},
                      {"cpu_s_per_gib", r.cpu_per_gib()}};
  fmt::print("{}\n", j.dump());
  std::fflush(stdout);
  return r;
}

void check(abi::Result r, const char* what) { ferry::cuda::check(r, what); }

void* pinned(std::size_t size) {
  void* p = nullptr;
  check(ferry::cuda::driver().MemHostAlloc(&p, size, abi::kMemHostAllocPortable), "cuMemHostAlloc");
  return p;
}

std::size_t pread_full(int fd, char* buf, std::size_t len, off_t off) {
  std::size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, buf + done, len - done, off + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(fmt::format("pread: {}", std::strerror(errno)));
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

// KvikIO's POSIX algorithm (and, with threads=1, the naive loop): each thread takes the next
// 4 MiB task, preads it into its own pinned buffer, then copies it to the GPU and waits.
void staged_read(const std::string& path, abi::DevicePtr dst, std::uint64_t size, int threads) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("open " + path);
  std::atomic<std::uint64_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      const auto& d = ferry::cuda::driver();
      ferry::cuda::use_device(0);
      char* buf = static_cast<char*>(pinned(kChunk));
      abi::Stream stream = nullptr;
      check(d.StreamCreate(&stream, abi::kStreamNonBlocking), "cuStreamCreate");
      for (;;) {
        std::uint64_t off = next.fetch_add(kChunk);
        if (off >= size) break;
        std::size_t len = std::min<std::uint64_t>(kChunk, size - off);
        std::size_t n = pread_full(fd, buf, len, static_cast<off_t>(off));
        check(d.MemcpyHtoDAsync(dst + off, buf, n, stream), "cuMemcpyHtoDAsync");
        check(d.StreamSynchronize(stream), "cuStreamSynchronize");
      }
      d.StreamDestroy(stream);
      d.MemFreeHost(buf);
    });
  }
  for (auto& t : pool) t.join();
  ::close(fd);
}

// The disk's own O_DIRECT rate: N threads of 4 MiB aligned preads into host memory.
void direct_read(const std::string& path, std::uint64_t size, int threads) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) throw std::runtime_error("open O_DIRECT " + path);
  std::atomic<std::uint64_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      char* buf = static_cast<char*>(std::aligned_alloc(4096, kChunk));
      for (;;) {
        std::uint64_t off = next.fetch_add(kChunk);
        if (off >= size) break;
        pread_full(fd, buf, std::min<std::uint64_t>(kChunk, size - off), static_cast<off_t>(off));
      }
      std::free(buf);
    });
  }
  for (auto& t : pool) t.join();
  ::close(fd);
}

std::uint64_t arg_size(int argc, char** argv, const char* name, std::uint64_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return ferry::parse_size(argv[i + 1], name);
  }
  return fallback;
}

std::string arg_text(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string path = arg_text(argc, argv, "--file", "/tmp/ferry-bench.bin");
  const std::uint64_t size = arg_size(argc, argv, "--size", std::uint64_t{8} << 30);
  const std::uint64_t cold_size = arg_size(argc, argv, "--cold-size", std::uint64_t{2} << 30);
  const std::uint64_t write_size = arg_size(argc, argv, "--write-size", std::uint64_t{4} << 30);
  const int repeat = static_cast<int>(arg_size(argc, argv, "--repeat", 3));
  const std::string sweep = arg_text(argc, argv, "--sweep", "yes");
  // The writes come from the GPU buffer the reads filled, which holds --size bytes.
  if (write_size > size) {
    fmt::print(stderr, "ferry_bench: --write-size ({} bytes) must not exceed --size ({} bytes)\n",
               write_size, size);
    return 2;
  }

  ferry::CudaStatus cuda = ferry::cuda_status();
  if (!cuda.available || cuda.gpus.empty()) {
    fmt::print(stderr, "ferry_bench needs a GPU: {}\n", cuda.why_not);
    return 2;
  }
  fmt::print(stderr, "GPU 0: {} ({}), driver {}\n", cuda.gpus[0].name, cuda.gpus[0].pci_bus_id,
             cuda.driver_version);

  // The test file: written once by ferry itself, then read once to sit in the page cache.
  {
    ferry::Buffer src(ferry::MemoryKind::kHostPageable, kChunk * 16);
    for (std::size_t i = 0; i < src.size(); ++i)
      static_cast<char*>(src.data())[i] = char(i * 131 + 7);
    ferry::File out(path, "w");
    for (std::uint64_t off = 0; off < size; off += src.size()) {
      out.write(src.data(), std::min<std::uint64_t>(src.size(), size - off), off);
    }
    out.sync();
  }
  ferry::Buffer gpu(ferry::MemoryKind::kDevice, size, 0);
  ferry::File file(path, "r");
  file.read(gpu.data(), size, 0);  // warm the page cache and the bounce pool
  const abi::DevicePtr dst = reinterpret_cast<abi::DevicePtr>(gpu.data());

  std::vector<Result> results;
  results.push_back(measure("ferry_read_gpu_default", size, repeat, [&] {
    if (file.read(gpu.data(), size, 0) != size) throw std::runtime_error("short read");
  }));
  fmt::print(stderr, "default settings took: {}\n", file.last_route().verdict());
  results.push_back(
      measure("pread_memcpy_1thread", size, repeat, [&] { staged_read(path, dst, size, 1); }));
  results.push_back(measure("kvikio_algorithm_16threads", size, repeat,
                            [&] { staged_read(path, dst, size, 16); }));
  {
    ferry::Buffer host(ferry::MemoryKind::kHostPinned, std::size_t{1} << 30, 0);
    ferry::cuda::use_device(0);
    results.push_back(measure("h2d_pinned_ceiling_1GiB", std::size_t{1} << 30, repeat, [&] {
      check(ferry::cuda::driver().MemcpyHtoD(dst, host.data(), host.size()), "cuMemcpyHtoD");
    }));
  }
  if (sweep == "yes") {
    for (const char* threads : {"4", "8", "16", "32"}) {
      for (const char* bounce : {"4MiB", "16MiB"}) {
        ferry::SettingsOverride o;
        o.set("nthreads", threads);
        o.set("bounce_buffer_size", bounce);
        ferry::File f(path, "r", ferry::FileOptions{false, o});
        results.push_back(measure(fmt::format("ferry_read_gpu_t{}_b{}", threads, bounce), size,
                                  repeat, [&] { f.read(gpu.data(), size, 0); }));
      }
    }
  }

  // Cold data: O_DIRECT bypasses the page cache, so these read the disk. The file was synced
  // after it was written, and the raw baseline runs before and after ferry, so writeback or a
  // warming disk cannot favour either side.
  {
    ferry::File direct(path, "r", ferry::FileOptions{true, {}});
    results.push_back(measure("odirect_pread_16threads_host", cold_size, 1,
                              [&] { direct_read(path, cold_size, 16); }));
    results.push_back(measure("ferry_read_gpu_direct_cold", cold_size, 1,
                              [&] { direct.read(gpu.data(), cold_size, 0); }));
    results.push_back(measure("odirect_pread_16threads_host_again", cold_size, 1,
                              [&] { direct_read(path, cold_size, 16); }));
  }

  // Writes from GPU memory into the page cache (no fsync on either side).
  {
    const std::string wpath = path + ".write";
    ferry::File w(wpath, "w");
    results.push_back(measure("ferry_write_from_gpu", write_size, repeat,
                              [&] { w.write(gpu.data(), write_size, 0); }));
    results.push_back(measure("memcpy_pwrite_1thread", write_size, repeat, [&] {
      int fd = ::open(wpath.c_str(), O_WRONLY);
      char* buf = static_cast<char*>(pinned(kChunk));
      for (std::uint64_t off = 0; off < write_size; off += kChunk) {
        std::size_t len = std::min<std::uint64_t>(kChunk, write_size - off);
        check(ferry::cuda::driver().MemcpyDtoH(buf, dst + off, len), "cuMemcpyDtoH");
        if (::pwrite(fd, buf, len, static_cast<off_t>(off)) != static_cast<ssize_t>(len)) {
          throw std::runtime_error("pwrite");
        }
      }
      ferry::cuda::driver().MemFreeHost(buf);
      ::close(fd);
    }));
    ::unlink(wpath.c_str());
  }

  auto find = [&](const std::string& name) -> const Result& {
    for (const Result& r : results) {
      if (r.name == name) return r;
    }
    throw std::runtime_error("no result " + name);
  };
  const Result& ferry_default = find("ferry_read_gpu_default");
  fmt::print(stderr, "\n{:<34} {:>9} {:>12} {:>16}\n", "case", "GB/s", "CPU-s/GiB", "ferry/this");
  for (const Result& r : results) {
    fmt::print(stderr, "{:<34} {:>9.2f} {:>12.3f} {:>16.2f}\n", r.name, r.gbps(), r.cpu_per_gib(),
               ferry_default.gbps() / r.gbps());
  }
  fmt::print(stderr,
             "\nferry default vs 1-thread pread+copy: {:.2f}x; vs KvikIO algorithm: {:.2f}x; "
             "of the pinned H2D ceiling: {:.0f}%\n",
             ferry_default.gbps() / find("pread_memcpy_1thread").gbps(),
             ferry_default.gbps() / find("kvikio_algorithm_16threads").gbps(),
             100 * ferry_default.gbps() / find("h2d_pinned_ceiling_1GiB").gbps());
  const double raw = std::max(find("odirect_pread_16threads_host").gbps(),
                              find("odirect_pread_16threads_host_again").gbps());
  fmt::print(stderr,
             "cold: ferry --direct {:.2f} GB/s vs raw O_DIRECT (best of 2) {:.2f} GB/s "
             "({:.2f}x)\n",
             find("ferry_read_gpu_direct_cold").gbps(), raw,
             find("ferry_read_gpu_direct_cold").gbps() / raw);
  fmt::print(stderr, "write from GPU: ferry {:.2f} GB/s vs 1-thread copy+pwrite {:.2f} GB/s\n",
             find("ferry_write_from_gpu").gbps(), find("memcpy_pwrite_1thread").gbps());
  ::unlink(path.c_str());
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "ferry_bench: {}\n", e.what());
  return 1;
}
