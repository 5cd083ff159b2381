// Helpers of the cuFile tests that run on the test double (libferry_fake_cufile.so). ferry loads
// libcufile and opens its driver once per process, and CTest runs every test in its own process
// (gtest_discover_tests), so each test sets the environment it needs before its first request.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cufile/cufile_testing.h"
#include "ferry/file.h"
#include "ferry/settings.h"
#include "io/page_cache.h"
#include "test_util.h"

namespace ferry::test {

inline std::filesystem::path test_data() {
  const char* d = std::getenv("FERRY_TEST_DATA");
  return d ? std::filesystem::path(d) : std::filesystem::path(FERRY_SOURCE_DIR "/tests/data");
}

// Points ferry at the double, makes layer 1 treat host buffers as GPU memory, and reads
// /proc/driver/nvidia-fs from a captured tree where the module is absent.
inline void use_fake_cufile(const char* library = FERRY_FAKE_CUFILE) {
  setenv("FERRY_CUFILE_LIBRARY", library, 1);
  cufile::testing::treat_host_as_gpu(true);
  cufile::testing::set_root(test_data() / "platform/nvfs_absent");
}

// The double on a machine where cuFile's accelerated path looks possible (nvidia-fs loaded, as
// in a captured tree) and every range is cold, so auto mode's speed rules send large GPU reads
// to cuFile: for tests of auto mode's fallbacks after the driver open or the registration.
inline void use_fake_gds_machine(const char* library = FERRY_FAKE_CUFILE) {
  use_fake_cufile(library);
  cufile::testing::set_root(test_data() / "platform/nvfs_rw_off");
  io::testing::set_resident_fraction(0.0);
}

// Calls one of the double's own counters; 0 when the double was never loaded.
inline long fake_counter(const char* name) {
  void* h = dlopen(FERRY_FAKE_CUFILE, RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return 0;
  auto fn = reinterpret_cast<long (*)()>(dlsym(h, name));
  long value = fn ? fn() : -1;
  dlclose(h);
  return value;
}
inline long fake_read_calls() { return fake_counter("ferry_fake_cufile_read_calls"); }
inline long fake_write_calls() { return fake_counter("ferry_fake_cufile_write_calls"); }
inline long fake_open_handles() { return fake_counter("ferry_fake_cufile_open_handles"); }

// compat_mode=off by default: cuFile on the double models a machine where cuFile has only its
// compatibility path (no nvidia-fs), which auto mode no longer chooses by itself.
inline SettingsOverride with(std::size_t task_size, CompatMode compat = CompatMode::kOff,
                             Require require = Require::kAny) {
  SettingsOverride o;
  o.task_size = task_size;
  o.compat_mode = compat;
  o.require = require;
  return o;
}

constexpr std::size_t kMiB = std::size_t{1} << 20;

// A file of `size` random bytes in a folder under the working directory (the build tree, on a
// file system that takes O_DIRECT, which cuFile needs; /tmp may be tmpfs).
class DataFile {
 public:
  explicit DataFile(std::size_t size, std::uint64_t seed = 7)
      : dir_(std::filesystem::current_path().string()), data_(random_bytes(size, seed)) {
    path_ = dir_ / "data.bin";
    write_file(path_, data_);
  }
  const std::filesystem::path& path() const { return path_; }
  const std::vector<unsigned char>& data() const { return data_; }

 private:
  TempDir dir_;
  std::filesystem::path path_;
  std::vector<unsigned char> data_;
};

}  // namespace ferry::test
