// Helpers of the cuFile tests that run on the test double (libferry_fake_cufile.so). ferry loads
// libcufile and opens its driver once per process, and CTest runs every test in its own process
// (gtest_discover_tests), so each test sets the environment it needs before its first request.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/paths.h"
#include "core/paths.h"
#include "ferry/file.h"
#include "ferry/runtime.h"
#include "ferry/settings.h"
#include "io/io_seam.h"
#include "test_data.h"
#include "test_hooks.h"
#include "test_runtime.h"
#include "test_util.h"

namespace ferry::test {

// The machine the cuFile tests run on, as an environment (core/paths.h) of a runtime of their own
// (fake_gpu_runtime()): the cuFile path reads its facts from a captured tree, layer 1 sees host
// buffers as GPU memory (the double reads into host memory), and the page cache may be given a
// residency (test_runtime.h). Set before the requests it should affect; thread-safe.
class FakeMachine {
 public:
  static FakeMachine& get() {
    static auto* m = new FakeMachine;  // leaked: the runtime's workers outlive static destructors
    return *m;
  }

  void host_as_gpu(bool on) { host_as_gpu_.store(on); }
  // Which GPU host memory stands for in requests submitted by the calling thread (0 unless set).
  static void set_thread_gpu(int device) { thread_gpu() = device; }
  void set_root(const std::filesystem::path& root) {
    std::lock_guard lock(mu_);
    cufile::Machine machine;
    machine.root = root;
    machine.gpu_uuid = [this](int device) { return uuid(device); };
    cufile_ = backends::make_cufile_path(std::move(machine));
  }
  // The UUID layer 2 uses for `device` in place of the driver's, or none to ask the driver.
  void set_gpu_uuid(int device, std::optional<std::string_view> uuid) {
    std::lock_guard lock(mu_);
    if (!uuid) {
      uuids_.erase(device);
      return;
    }
    std::array<char, 16> bytes{};
    std::copy_n(uuid->data(), std::min(uuid->size(), bytes.size()), bytes.begin());
    uuids_[device] = bytes;
  }
  // Every range measured reports this fraction resident (method "test"); nullopt: measured.
  void set_resident_fraction(std::optional<double> f) { test::set_resident_fraction(f); }

  Runtime* runtime() { return runtime_.get(); }
  // The environment runtime() carries (the same doubles), for plans made without a File.
  core::Environment environment() {
    core::Environment env;
    env.io = &io::system_io();
    env.remote = backends::default_environment().remote;  // URLs as the process reads them
    env.host = &residency_host();
    env.accelerated = &accelerated_;
    EnvironmentTestHelper::set_layer1_view(env, [this](const MemoryInfo& memory) {
      if (!host_as_gpu_.load() || is_gpu(memory.kind)) return memory;
      return MemoryInfo{MemoryKind::kDevice, thread_gpu(), {}};
    });
    return env;
  }

 private:
  class Cufile final : public core::AcceleratedPath {
   public:
    explicit Cufile(FakeMachine& m) : m_(m) {}
    std::optional<std::string> compat_only(int fd) const override {
      return current()->compat_only(fd);
    }
    core::AcceleratedProbe probe(core::OpenFile& file, const Settings& s) const override {
      return current()->probe(file, s);
    }
    std::unique_ptr<core::Layer2Window> observe(Op op, int device) const override {
      return current()->observe(op, device);
    }

   private:
    std::shared_ptr<core::AcceleratedPath> current() const {
      std::lock_guard lock(m_.mu_);
      return m_.cufile_;
    }
    FakeMachine& m_;
  };

  FakeMachine() : accelerated_(*this), runtime_(RuntimeTestHelper::make(environment())) {
    set_root(test_data() / "platform/nvfs_absent");
  }

  std::optional<std::array<char, 16>> uuid(int device) {
    std::lock_guard lock(mu_);
    auto it = uuids_.find(device);
    if (it == uuids_.end()) return std::nullopt;
    return it->second;
  }
  static int& thread_gpu() {
    thread_local int device = 0;
    return device;
  }

  std::mutex mu_;
  std::shared_ptr<core::AcceleratedPath> cufile_;
  std::map<int, std::array<char, 16>> uuids_;
  std::atomic<bool> host_as_gpu_{true};
  Cufile accelerated_;
  std::unique_ptr<Runtime> runtime_;
};

// The runtime the cuFile tests' Files use: FakeMachine's environment.
inline Runtime* fake_gpu_runtime() { return FakeMachine::get().runtime(); }

// Points ferry at the double, has layer 1 treat host buffers as GPU memory, and reads
// /proc/driver/nvidia-fs from a captured tree where the module is absent.
inline void use_fake_cufile(const char* library = FERRY_FAKE_CUFILE) {
  setenv("FERRY_CUFILE_LIBRARY", library, 1);
  FakeMachine::get().host_as_gpu(true);
  FakeMachine::get().set_root(test_data() / "platform/nvfs_absent");
}

// The double on a machine where cuFile's accelerated path looks possible (nvidia-fs loaded, as
// in a captured tree) and every range is cold, so auto mode's speed rules send large GPU reads
// to cuFile: for tests of auto mode's fallbacks after the driver open or the registration.
inline void use_fake_gds_machine(const char* library = FERRY_FAKE_CUFILE) {
  use_fake_cufile(library);
  FakeMachine::get().set_root(test_data() / "platform/nvfs_rw_off");
  FakeMachine::get().set_resident_fraction(0.0);
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
