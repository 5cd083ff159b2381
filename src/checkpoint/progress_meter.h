// ProgressMeter: calls a ProgressOptions' callback for one load or save, from the one thread that
// waits for its requests: throttled to the interval, `done` never going down, done == total once
// at the end, and silent once the callback has thrown. Not thread-safe: that one thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "ferry/checkpoint.h"
#include "ferry/file.h"

namespace ferry::checkpoint {

// Seconds of the steady clock since `t0`: the seconds a load's or save's report gives.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class ProgressMeter {
 public:
  // Holds `options` by reference: they outlive the meter.
  ProgressMeter(const ProgressOptions& options, std::uint64_t total);

  bool on() const { return static_cast<bool>(options_.callback) && !stopped_; }
  // Calls the callback with `done` if the interval has passed since the last call.
  void report(std::uint64_t done);
  // Waits for `future`, calling report(done()) every interval meanwhile. Returns once the future
  // is complete, also when the callback throws (its exception is then rethrown).
  void wait(const IoFuture& future, const std::function<std::uint64_t()>& done);
  // The last call: done == total. Once only.
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  void call(std::uint64_t done);

  const ProgressOptions& options_;
  std::uint64_t total_;
  std::uint64_t last_done_ = 0;
  Clock::time_point last_call_;
  bool stopped_ = false;  // the callback threw, or finish() ran
};

}  // namespace ferry::checkpoint
