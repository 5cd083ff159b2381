// The tests' ways into production classes, in the style of LevelDB's EnvPosixTestHelper: each
// class names its helper a friend and the helper is defined only here, so no test hook sits on a
// production interface (scripts/check-layering fails on one). Functions declared at the bottom
// are defined in production files for tests alone and declared nowhere else.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string_view>
#include <utility>

#include "backends/default_runtime.h"
#include "core/open_file.h"
#include "core/paths.h"
#include "ferry/file.h"
#include "ferry/runtime.h"
#include "io/io_seam.h"

namespace ferry::test {

class FileTestHelper {
 public:
  // A File on `path` whose system calls go through `io` (faults, delays, counters).
  static File open(const std::filesystem::path& path, std::string_view mode,
                   const FileOptions& options, io::IoSeam& io) {
    return File(
        std::make_shared<core::OpenFile>(path, mode, options, backends::runtime_of(options), &io));
  }
};

class EnvironmentTestHelper {
 public:
  // Layer 1 of `env` decides on the memory `view` makes of a request's buffer (cuFile's double
  // reads "GPU" bytes into host memory); none of its requests then runs inline.
  static void set_layer1_view(core::Environment& env,
                              std::function<MemoryInfo(const MemoryInfo&)> view) {
    env.layer1_memory_ = std::move(view);
  }
};

class RuntimeTestHelper {
 public:
  // A runtime whose requests run against `env`, an environment of the test's doubles.
  static std::unique_ptr<Runtime> make(const core::Environment& env) {
    return std::unique_ptr<Runtime>(new Runtime(env));
  }
};

}  // namespace ferry::test

namespace ferry {
// src/core/settings.cc: forgets the process-wide settings, set_settings() changes included, and
// reads the environment again at the next use, as at start-up (scopes stay).
void reload_settings_from_environment();
}  // namespace ferry

namespace ferry::cuda {
// src/cuda/stream_order.cc: the gate slots in use (every slot comes back once its request
// completes), and the pinned staging that stream-ordered GPU requests hold now, in bytes.
std::size_t stream_gates_in_use();
std::size_t staging_in_flight();
// The bound on that staging (StagedCopies::kStagingInFlight until set), so that a test proves
// the bound with a few MiB instead of 256.
void set_staging_in_flight_bound(std::size_t bytes);
}  // namespace ferry::cuda
