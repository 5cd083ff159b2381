// The CLI's progress line on stderr: "reading  3.20 GiB / 8.00 GiB  40%  2.45 GB/s  ETA 2s",
// drawn only where stderr is a terminal and the command prints text (not --json), first after a
// moment (a short request shows none), redrawn at most every 0.1 s, and erased when done.
// Single-threaded use: the thread that waits for the work draws.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ferry::cli {

// One line of progress: `done` bytes of `total` (0: not known) after `seconds`, the rate being
// the average since the start. `planned_seconds` > 0: the work runs for that long whatever the
// bytes (bench's --seconds), and the percentage and ETA come from the time. The ETA is rounded up
// to whole seconds ("ETA 2s", "ETA 1m05s", "ETA 2h03m"), "ETA --" while no byte has moved.
std::string progress_line(const std::string& label, std::uint64_t done, std::uint64_t total,
                          double seconds, double planned_seconds = 0);

// Whether a command may draw progress: stderr is a terminal and `json` output was not asked for.
bool progress_wanted(bool json);

class ProgressBar {
 public:
  // Draws nothing unless `enabled` (progress_wanted()).
  ProgressBar(std::string label, std::uint64_t total, bool enabled, double planned_seconds = 0);
  ~ProgressBar();  // erases the line
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Redraws with `done` bytes, if the first frame's moment and 0.1 s since the last have passed.
  void update(std::uint64_t done);
  // The same, the total being known only now (a load's progress callback says it).
  void update(std::uint64_t done, std::uint64_t total) {
    total_ = total;
    update(done);
  }
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  std::uint64_t total_;
  bool enabled_;
  double planned_seconds_;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_draw_{};
  bool drawn_ = false;
};

}  // namespace ferry::cli
