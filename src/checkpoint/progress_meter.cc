#include "checkpoint/progress_meter.h"

#include <algorithm>

namespace ferry::checkpoint {

ProgressMeter::ProgressMeter(const ProgressOptions& options, std::uint64_t total)
    : options_(options), total_(total), last_call_(Clock::now()) {}

void ProgressMeter::call(std::uint64_t done) {
  last_done_ = std::clamp(done, last_done_, total_);
  last_call_ = Clock::now();
  try {
    options_.callback(last_done_, total_);
  } catch (...) {
    stopped_ = true;  // never called again, not even by the unwinding caller's waits
    throw;
  }
}

void ProgressMeter::report(std::uint64_t done) {
  if (!on()) return;
  if (std::chrono::duration<double>(Clock::now() - last_call_).count() < options_.interval_seconds)
    return;
  call(done);
}

void ProgressMeter::wait(const IoFuture& future, const std::function<std::uint64_t()>& done) {
  // A wait of at least a millisecond: an interval of 0 would spin.
  const double step = std::max(options_.interval_seconds, 0.001);
  while (on() && !future.wait_for(step)) {
    try {
      report(done());
    } catch (...) {
      future.wait();  // nothing may still move the caller's bytes once this throws
      throw;
    }
  }
  future.wait();
}

void ProgressMeter::finish() {
  if (!on()) return;
  call(total_);
  stopped_ = true;
}

}  // namespace ferry::checkpoint
