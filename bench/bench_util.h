// What the C++ benchmarks share: a clock, their one flag form (`--name value`), and a data file
// of random bytes made and read once, so that every case finds it in the page cache.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace ferry::bench {

using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The value after `name` on the command line, or `fallback`.
inline std::string arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return fallback;
}

// Writes `size` random bytes (from `seed`) to `path`, then reads them once.
inline void make_cached_file(const std::string& path, std::size_t size, unsigned seed) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path);
  std::vector<char> chunk(std::size_t{1} << 20);
  std::mt19937_64 rng(seed);
  for (std::size_t done = 0; done < size; done += chunk.size()) {
    for (auto& c : chunk) c = static_cast<char>(rng());
    if (::pwrite(fd, chunk.data(), chunk.size(), static_cast<off_t>(done)) < 0) {
      ::close(fd);
      throw std::runtime_error("cannot write " + path);
    }
  }
  for (std::size_t done = 0; done < size; done += chunk.size()) {
    if (::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(done)) < 0) {
      ::close(fd);
      throw std::runtime_error("cannot read " + path);
    }
  }
  ::close(fd);
}

}  // namespace ferry::bench
