// Helpers shared by ferry's tests: temporary folders that clean up, environment variables set
// for a scope, files of random content, and a reference pread. Not thread-safe unless stated.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/error.h"

namespace ferry::test {

class TempDir {
 public:
  explicit TempDir(const std::string& parent = "") {
    std::string base = parent.empty() ? std::filesystem::temp_directory_path().string() : parent;
    std::string pattern = base + "/ferry-test-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Expects `body` to throw ferry::IoError with errno `err` whose message and path name `path`.
template <typename Body>
void expect_io_error(Body body, const std::string& path, int err) {
  try {
    body();
    ADD_FAILURE() << "no error for " << path;
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), err) << e.what();
    EXPECT_EQ(e.path(), path);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

// The sanitizer this test binary was built with, for tests that cannot run under it.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#else
inline constexpr bool kThreadSanitizer = false;
#endif
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// What tests that move bulk data divide their sizes by: 4 under a sanitizer, else 1. There every
// byte copied or compared is also checked in shadow memory (TSan ran the libcuda double's bulk
// tests 15 times slower than the plain build, most of it in __tsan::MemoryAccessRange and its
// page faults), while what they check is where the bytes cross task, chunk and staging
// boundaries. So a test divides its data and the task and staging sizes it is measured in alike,
// keeping the count of boundaries it crosses; the plain build keeps the full sizes.
inline constexpr std::size_t kShrink = kThreadSanitizer || kAddressSanitizer ? 4 : 1;
// `bytes` / kShrink as a setting's value (a size in bytes), for task_size and bounce_buffer_size.
inline std::string shrunk(std::size_t bytes) { return std::to_string(bytes / kShrink); }

// True where the GPU tests run on the test double of libcuda (tests/fake_cuda), which keeps
// device memory in host RAM and runs cuMemsetD8 synchronously.
inline bool on_fake_cuda() {
  const char* lib = std::getenv("FERRY_CUDA_LIBRARY");
  return lib != nullptr && std::string_view(lib).find("fake_cuda") != std::string_view::npos;
}

// The hardware queues the test double of libcuda gives streams: CUDA_DEVICE_MAX_CONNECTIONS,
// else its variant's default (tests/fake_cuda/CMakeLists.txt).
inline int fake_cuda_queues() {
  const char* v = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  if (v != nullptr && *v != '\0') return std::atoi(v);
  const char* lib = std::getenv("FERRY_CUDA_LIBRARY");
  return lib != nullptr && std::string_view(lib).find("one_queue") != std::string_view::npos ? 1
                                                                                             : 8;
}

// Sets (or, with nullptr, unsets) an environment variable for one scope, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    had_ = before != nullptr;
    if (had_) before_ = before;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_.c_str(), before_.c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::string before_;
  bool had_ = false;
};

inline std::vector<unsigned char> random_bytes(std::size_t size, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> out(size);
  for (std::size_t i = 0; i < size; i += 8) {
    std::uint64_t v = rng();
    for (std::size_t j = 0; j < 8 && i + j < size; ++j)
      out[i + j] = static_cast<unsigned char>(v >> (8 * j));
  }
  return out;
}

// Like random_bytes but fast enough for gigabytes (splitmix64 per 8-byte word).
inline std::vector<unsigned char> pattern_bytes(std::size_t size, std::uint64_t seed) {
  std::vector<unsigned char> out(size);
  std::uint64_t index = seed << 40;
  for (std::size_t i = 0; i < size; i += 8, ++index) {
    std::uint64_t z = index * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, std::min<std::size_t>(8, size - i));
  }
  return out;
}

inline void write_file(const std::filesystem::path& path, const std::vector<unsigned char>& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("open " + path.string());
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n <= 0) throw std::runtime_error("write " + path.string());
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
}

inline std::vector<unsigned char> read_file(const std::filesystem::path& path) {
  std::vector<unsigned char> out(std::filesystem::file_size(path));
  int fd = ::open(path.c_str(), O_RDONLY);
  std::size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

// What /proc/self/smaps says of the mapping that holds `p`: its size, its pages in this process's
// page tables (a lazy mapping none until touched, a populated one all) and its VmFlags (the
// advice it was given: "hg" MADV_HUGEPAGE, "sq" MADV_SEQUENTIAL, "rr" MADV_RANDOM...).
struct MappingFacts {
  std::uint64_t size_kib = 0;
  std::uint64_t rss_kib = 0;
  std::string flags;
  bool found = false;
};
inline MappingFacts mapping_facts(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  MappingFacts facts;
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      if (inside) break;  // past the mapping
      inside = lo <= at && at < hi;
      facts.found = inside;
      continue;
    }
    if (!inside) continue;
    std::istringstream field(line);
    std::string key;
    field >> key;
    if (key == "Size:") field >> facts.size_kib;
    if (key == "Rss:") field >> facts.rss_kib;
    if (key == "VmFlags:") facts.flags = line;
  }
  return facts;
}

}  // namespace ferry::test
