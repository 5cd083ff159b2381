// What the engine runs against, as LevelDB's Options carry an Env: the system calls on files
// (io::IoSeam), ferry's own POSIX path, always there, an accelerated path (cuFile) that may
// be absent, and the clock, settings and statistics (Ambient). Each runtime carries one Environment
// (core/runtime_state.h) and every request of its Files asks it, never a global. Core includes only
// this seam; the real paths are wired in by src/backends/paths.cc, the one file that knows every
// backend, which makes the default environment once. Tests give a ferry::Runtime an environment of
// their own doubles. The objects an Environment points to outlive every runtime that carries it and
// are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/backend.h"
#include "core/open_file.h"
#include "ferry/memory.h"
#include "ferry/route.h"
#include "ferry/settings.h"
#include "io/io_seam.h"
#include "stats/stats_recorder.h"

namespace ferry::test {
class EnvironmentTestHelper;
}  // namespace ferry::test

namespace ferry::core {

// ferry's POSIX path: a Backend, plus what small requests and layer 1 ask of it directly.
class HostPath : public Backend {
 public:
  // Runs one task in the calling thread, with a worker on its stack (small requests).
  virtual std::size_t run_inline(const RequestContext& context, const Task& task) const = 0;
  // How much of [offset, offset + size) of `fd` is in the page cache, without reading it.
  virtual PageCacheResidency residency(int fd, std::uint64_t offset, std::uint64_t size) const = 0;
  // Reads of at least this many bytes may go to O_DIRECT when cold: their residency is measured.
  virtual std::uint64_t cold_task_min() const = 0;
  // Readies `file` for a write of [offset, offset + size) on this path (blocks allocated ahead);
  // what it did, in words for the route report, or empty.
  virtual std::string prepare_write(OpenFile& file, std::uint64_t offset,
                                    std::uint64_t size) const = 0;
  // describe() for a request run in its caller's thread (one worker) on a buffered descriptor,
  // from the facts alone: a small request's report is built after its File may be gone.
  virtual std::string describe_inline(Op op, const MemoryInfo& memory,
                                      const Settings& settings) const = 0;
};

// One request's window on the accelerated path's own counters (layer 2): opened right before the
// request's first call, closed after its last.
class Layer2Window {
 public:
  virtual ~Layer2Window() = default;
  virtual void end(CufileCounts& out) = 0;
};

// The outcome of asking whether the accelerated path can serve one file.
struct AcceleratedProbe {
  std::shared_ptr<Backend> backend;  // null when it cannot; holds the file's handle while used
  std::string why_not;
  bool compat_refused = false;  // its driver was opened with the compatibility path refused
};

class AcceleratedPath {
 public:
  virtual ~AcceleratedPath() = default;
  // From cheap facts only (no driver open): nullopt when the path could accelerate this file,
  // else why it could only use its compatibility path. fd -1: a file not yet named (ferry plan,
  // ferry check): the process's facts alone.
  virtual std::optional<std::string> compat_only(int fd) const = 0;
  // Opens what it needs (library, driver, the file's handle): the backend, or why not.
  virtual AcceleratedProbe probe(OpenFile& file, const Settings& settings) const = 0;
  // `device`: the GPU the request's memory is on (-1: not known), whose own entry of the
  // counters it is judged on where the path can name it.
  virtual std::unique_ptr<Layer2Window> observe(Op op, int device) const = 0;
};

using Clock = std::chrono::steady_clock;

// What a request reads from around it: the clock it times itself by, the settings it runs with,
// the statistics it is counted in. The process's unless a runtime is given its own
// (TestAmbient in tests/test_runtime.h); the methods are statistics::'s (src/stats/). Thread-safe.
class Ambient {
 public:
  virtual ~Ambient() = default;
  virtual Clock::time_point now() const = 0;
  // The settings of a request of a File with these overrides.
  virtual Settings settings(const SettingsOverride& file) const = 0;
  virtual void record_request(const RouteReport& report, bool failed) const = 0;
  virtual void record_small_request(Op op, std::uint64_t bytes, std::uint64_t nanoseconds,
                                    ReasonCode layer1, bool cold_direct, int device) const = 0;
  virtual void note_request_started(std::uint64_t bytes) const = 0;
  virtual void note_request_ended(std::uint64_t bytes) const = 0;
};

struct Environment {
  io::IoSeam* io = nullptr;
  // The seam of remote objects (http://, https://, s3://: src/remote/); null: none.
  io::IoSeam* remote = nullptr;
  HostPath* host = nullptr;
  const AcceleratedPath* accelerated = nullptr;
  // Null: the process's clock, settings and statistics, called directly (no indirect call on
  // the small path).
  const Ambient* ambient = nullptr;

  // The memory layer 1 decides on, given what a request's buffer is: the buffer's own, unless
  // this environment was given a view of its own (layer1_memory_).
  MemoryInfo layer1_view(const MemoryInfo& memory) const {
    return layer1_memory_ ? layer1_memory_(memory) : memory;
  }
  // Whether layer 1 sees every buffer as what it is; a request runs inline in its caller's thread
  // (the small path) only where it does.
  bool layer1_sees_buffers_as_they_are() const { return !layer1_memory_; }
  Clock::time_point now() const { return ambient ? ambient->now() : Clock::now(); }
  Settings settings(const SettingsOverride& file) const {
    return ambient ? ambient->settings(file) : settings_with(file);
  }
  void record_request(const RouteReport& report, bool failed) const {
    ambient ? ambient->record_request(report, failed) : statistics::record_request(report, failed);
  }
  // A small request that ended well: its record and the end of the `started` bytes.
  void end_small_request(Op op, std::uint64_t bytes, std::uint64_t nanoseconds, ReasonCode layer1,
                         bool cold_direct, int device, std::uint64_t started) const {
    if (ambient == nullptr) {
      statistics::end_small_request(op, bytes, nanoseconds, layer1, cold_direct, device, started);
      return;
    }
    ambient->record_small_request(op, bytes, nanoseconds, layer1, cold_direct, device);
    ambient->note_request_ended(started);
  }
  void note_request_started(std::uint64_t bytes) const {
    ambient ? ambient->note_request_started(bytes) : statistics::note_request_started(bytes);
  }
  void note_request_ended(std::uint64_t bytes) const {
    ambient ? ambient->note_request_ended(bytes) : statistics::note_request_ended(bytes);
  }

 private:
  // tests/test_hooks.h sets this, and nothing else does: an environment whose accelerated path
  // moves "GPU" bytes through host memory (cuFile's double on a machine without a GPU) sees host
  // buffers as GPU memory here; the bytes still move as what they are. Empty: the buffer's own.
  friend class test::EnvironmentTestHelper;
  std::function<MemoryInfo(const MemoryInfo&)> layer1_memory_;
};

}  // namespace ferry::core
