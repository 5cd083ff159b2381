// Gathered reads and scattered writes (issue 14): many random ranges of one page-cached file into
// one buffer (and from it), side by side in one run:
//   - raw: a pread per range in one thread (then a synchronous copy to the GPU for GPU memory;
//     for writes the copy from the GPU, then a pwrite);
//   - ferry per range: File::read (File::write) per range in one thread (one request each);
//   - ferry gathered: one File::pread_ranges (File::pwrite_ranges) call, default settings.
// For 4 KiB and 64 KiB ranges, into and from host memory, and GPU 0 where a GPU is found. The first
// gathered call of the process is reported beside the best of the following ones. One JSON
// object per case on stdout, a table with the targets on stderr.
// Usage: ferry_gather_bench [--file PATH] [--file-mib N] [--ranges N]
#include <fcntl.h>
#include <ferry/ferry.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"

namespace {

using ferry::bench::arg;
using ferry::bench::Clock;
using ferry::bench::make_cached_file;
using ferry::bench::since;

struct Case {
  std::string name;
  double raw_per_s = 0;
  double per_range_per_s = 0;
  double gathered_first_per_s = 0;
  double gathered_best_per_s = 0;
  std::string verdict;
};

// One case: `n` ranges of `io` bytes at random aligned offsets of the file into `dst` (host or
// GPU memory), or, for `write`, from `dst` to `n` distinct random slots of the file.
Case run_case(const std::string& path, std::uint64_t file_size, std::size_t io, std::size_t n,
              ferry::Buffer& dst, bool gpu, bool write) {
  std::mt19937_64 rng(io);
  std::vector<ferry::ByteRange> ranges(n);
  if (write) {
    // The ranges of one scattered write must not overlap: distinct slots, in random order.
    std::vector<std::uint64_t> slots(file_size / io);
    for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = i;
    std::shuffle(slots.begin(), slots.end(), rng);
    for (std::size_t i = 0; i < n; ++i) ranges[i] = {slots[i] * io, io, i * io};
  } else {
    for (std::size_t i = 0; i < n; ++i) ranges[i] = {rng() % (file_size / io) * io, io, i * io};
  }
  char* out = static_cast<char*>(dst.data());
  dst.fill(0);  // every page touched before the first timing: no case pays the faults
  Case c;
  c.name = fmt::format("{} KiB ranges {} {}", io >> 10, write ? "from" : "into",
                       gpu ? "GPU 0" : "host memory");
  {
    // The baseline: pread into a pinned staging buffer (host: straight into the destination),
    // then a synchronous copy to the GPU; for writes the copy from the GPU, then pwrite.
    int fd = ::open(path.c_str(), write ? O_WRONLY : O_RDONLY);
    std::optional<ferry::Buffer> staging;
    if (gpu) staging.emplace(ferry::MemoryKind::kHostPinned, io, 0);
    auto t0 = Clock::now();
    for (const auto& r : ranges) {
      char* at = gpu ? static_cast<char*>(staging->data()) : out + r.buffer_offset;
      const off_t offset = static_cast<off_t>(r.file_offset);
      if (write && gpu) dst.copy_to_host(at, io, r.buffer_offset);
      const ssize_t moved = write ? ::pwrite(fd, at, io, offset) : ::pread(fd, at, io, offset);
      if (moved != static_cast<ssize_t>(io)) throw std::runtime_error("short pread or pwrite");
      if (!write && gpu) dst.copy_from_host(at, io, r.buffer_offset);
    }
    c.raw_per_s = n / since(t0);
    ::close(fd);
  }
  ferry::File f(path, write ? "r+" : "r");
  {
    auto t0 = Clock::now();
    for (const auto& r : ranges) {
      if (write) {
        f.write(out + r.buffer_offset, io, r.file_offset);
      } else {
        f.read(out + r.buffer_offset, io, r.file_offset);
      }
    }
    c.per_range_per_s = n / since(t0);
  }
  ferry::File g(path, write ? "r+" : "r");  // a File of its own: its first call is the first
  for (int round = 0; round < 4; ++round) {
    auto t0 = Clock::now();
    ferry::IoFuture fut =
        write ? g.pwrite_ranges(out, dst.size(), ranges) : g.pread_ranges(out, dst.size(), ranges);
    if (fut.get() != n * io) throw std::runtime_error("gathered request came back short");
    const double rate = n / since(t0);
    if (round == 0) {
      c.gathered_first_per_s = rate;
      c.verdict = fut.route().verdict();
    } else {
      c.gathered_best_per_s = std::max(c.gathered_best_per_s, rate);
    }
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string path = arg(argc, argv, "--file", "/tmp/ferry-gather-bench.bin");
  const std::size_t file_size = std::stoull(arg(argc, argv, "--file-mib", "1024")) << 20;
  const std::size_t n = std::stoull(arg(argc, argv, "--ranges", "200000"));
  make_cached_file(path, file_size, 11);
  std::vector<Case> cases;
  const bool have_gpu = !ferry::cuda_status().gpus.empty();
  for (bool gpu : {false, true}) {
    if (gpu && !have_gpu) {
      fmt::print(stderr, "GPU cases skipped: {}\n", ferry::cuda_status().why_not);
      continue;
    }
    for (bool write : {false, true}) {
      for (std::size_t io : {std::size_t{4} << 10, std::size_t{64} << 10}) {
        std::size_t count = io == (std::size_t{4} << 10) ? n : n / 8;
        if (write) count = std::min<std::size_t>(count, file_size / io);  // distinct slots
        ferry::Buffer dst(gpu ? ferry::MemoryKind::kDevice : ferry::MemoryKind::kHostPageable,
                          count * io, 0);
        Case c = run_case(path, file_size, io, count, dst, gpu, write);
        nlohmann::json j = {{"case", c.name},
                            {"ranges", count},
                            {"raw_ranges_per_s", c.raw_per_s},
                            {"per_range_ranges_per_s", c.per_range_per_s},
                            {"gathered_first_ranges_per_s", c.gathered_first_per_s},
                            {"gathered_best_ranges_per_s", c.gathered_best_per_s},
                            {"verdict", c.verdict}};
        fmt::print("{}\n", j.dump());
        cases.push_back(std::move(c));
      }
    }
  }
  ::unlink(path.c_str());
  fmt::print(stderr, "\n{:<30} {:>12} {:>12} {:>12} {:>12} {:>8} {:>8}\n", "case (ranges/s)",
             "raw loop", "per range", "gathered 1st", "gathered", "x raw", "x per");
  for (const Case& c : cases) {
    fmt::print(stderr, "{:<30} {:>12.0f} {:>12.0f} {:>12.0f} {:>12.0f} {:>8.2f} {:>8.2f}\n", c.name,
               c.raw_per_s, c.per_range_per_s, c.gathered_first_per_s, c.gathered_best_per_s,
               c.gathered_first_per_s / c.raw_per_s, c.gathered_first_per_s / c.per_range_per_s);
  }
  fmt::print(stderr,
             "targets (issue 14, GPU machine, 4 KiB into GPU memory): >= 1 M ranges/s, >= 10x the "
             "per-range loop\n");
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "ferry_gather_bench: {}\n", e.what());
  return 1;
}
