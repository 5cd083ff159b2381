// ferry::Runtime: the worker threads and the staging memory that requests run on. Files use the
// process's default runtime unless FileOptions::runtime names another: to give a group of Files
// workers of their own, or to get ferry's threads and pinned memory back when done with them.
// Threads start with the first request that needs them; staging memory is kept for reuse until
// the runtime is destroyed. The destructor waits for the Files that use the runtime to be closed
// (their requests done), then joins the workers and frees the staging memory. Thread-safe.
#pragma once

#include <cstddef>
#include <memory>

namespace ferry {

class Runtime;
namespace core {
class RuntimeState;
struct Environment;
// The state behind a Runtime, for the engine (src/core/runtime_state.cc).
RuntimeState& state_of(const Runtime& runtime);
}  // namespace core
namespace test {
class RuntimeTestHelper;
}  // namespace test

class Runtime {
 public:
  Runtime();
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Worker threads started so far.
  std::size_t threads() const;
  // Sets of staging buffers kept for reuse (one per worker that needed them).
  std::size_t idle_staging() const;
  // Frees the staging buffers no request is using (pinned memory for GPU reads and writes,
  // aligned buffers for O_DIRECT) and returns their bytes; later requests make new ones, which
  // costs milliseconds each. KvikIO's bounce_buffer_free().
  std::size_t free_idle_staging();
  // Open Files that use this runtime.
  std::size_t files() const;

 private:
  friend core::RuntimeState& core::state_of(const Runtime& runtime);
  // tests/test_hooks.h: a runtime whose requests run against an environment of the test's
  // doubles (src/core/paths.h) instead of the default one.
  friend class test::RuntimeTestHelper;
  explicit Runtime(const core::Environment& env);

  std::unique_ptr<core::RuntimeState> state_;
};

// The same for the process's default runtime (the one Files use unless FileOptions::runtime
// names another), and for the staging of stream-ordered GPU requests (File::read_async), which
// all runtimes share.
std::size_t free_idle_staging();

}  // namespace ferry
