// What allocating ahead buys a buffered write (bench/NOTES.md §4): one thread writes a new file
// from host memory with pwrite in calls of --chunk bytes (1 MiB unless told), into the page cache
// (no fsync), with its blocks left to delayed allocation ("delalloc", what a plain write does) and
// with them allocated first by fallocate(FALLOC_FL_KEEP_SIZE) ("keep_size", what ferry does on ext4
// for a write of 8 MiB or more beyond the end), the two interleaved for --rounds rounds. One JSON
// line per run, then the medians. The file is removed after each run, so no run writes over
// another's pages. Usage: ferry_write_alloc_bench [--file PATH] [--size BYTES] [--rounds N]
// [--chunk BYTES]
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/falloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "ferry/settings.h"

namespace {

double cpu_seconds() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
}

struct Run {
  double gbps;
  double cpu_per_gib;
};

Run write_once(const std::string& path, const std::vector<char>& chunk, std::uint64_t size,
               bool keep_size) {
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("open {}: {}", path, std::strerror(errno)));
  const auto t0 = std::chrono::steady_clock::now();
  const double c0 = cpu_seconds();
  if (keep_size && ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(size)) != 0) {
    throw std::runtime_error(fmt::format("fallocate {}: {}", path, std::strerror(errno)));
  }
  for (std::uint64_t off = 0; off < size; off += chunk.size()) {
    const std::size_t n = std::min<std::uint64_t>(chunk.size(), size - off);
    if (::pwrite(fd, chunk.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      throw std::runtime_error(fmt::format("pwrite {} at {}: {}", path, off, std::strerror(errno)));
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = cpu_seconds() - c0;
  ::close(fd);
  ::unlink(path.c_str());
  return {static_cast<double>(size) / s / 1e9, cpu / (static_cast<double>(size) / (1 << 30))};
}

std::string arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty()      ? 0
         : v.size() % 2 ? v[v.size() / 2]
                        : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string path = arg(argc, argv, "--file", "ferry-write-alloc.bin");
  const std::uint64_t size = ferry::parse_size(arg(argc, argv, "--size", "2GiB"), "--size");
  const int rounds = std::stoi(arg(argc, argv, "--rounds", "6"));
  const std::uint64_t chunk_size = ferry::parse_size(arg(argc, argv, "--chunk", "1MiB"), "--chunk");
  if (chunk_size == 0) throw std::runtime_error("--chunk must be at least 1 byte");
  std::vector<char> chunk(chunk_size);
  for (std::size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<char>(i * 131 + 7);
  std::map<std::string, std::vector<Run>> runs;
  for (int round = 0; round < rounds; ++round) {
    for (bool keep_size : {round % 2 == 0, round % 2 != 0}) {  // who goes first alternates
      const char* name = keep_size ? "keep_size" : "delalloc";
      const Run r = write_once(path, chunk, size, keep_size);
      runs[name].push_back(r);
      fmt::print(
          "{{\"case\":\"{}\",\"round\":{},\"bytes\":{},\"chunk\":{},\"gbps\":{:.3f},"
          "\"cpu_seconds_per_gib\":{:.4f}}}\n",
          name, round, size, chunk.size(), r.gbps, r.cpu_per_gib);
    }
  }
  std::map<std::string, std::pair<double, double>> med;
  for (auto& [name, v] : runs) {
    std::vector<double> g, c;
    for (const Run& r : v) {
      g.push_back(r.gbps);
      c.push_back(r.cpu_per_gib);
    }
    med[name] = {median(g), median(c)};
    fmt::print(stderr, "{:<10} median {:.2f} GB/s, {:.3f} CPU-s/GiB ({} runs)\n", name,
               med[name].first, med[name].second, v.size());
  }
  fmt::print(stderr, "keep_size / delalloc: {:.2f}x the speed, {:.2f}x the CPU per GiB\n",
             med["keep_size"].first / med["delalloc"].first,
             med["keep_size"].second / med["delalloc"].second);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "ferry_write_alloc_bench: {}\n", e.what());
  return 1;
}
