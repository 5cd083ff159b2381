#include "progress.h"

#include <ferry/sizes.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common.h"

namespace ferry::cli {

namespace {

// A request shorter than this shows no line at all; then one frame per kRedraw at most.
constexpr double kFirstFrame = 0.3;
constexpr double kRedraw = 0.1;

std::string eta_words(double seconds) {
  const auto s = static_cast<std::uint64_t>(std::ceil(std::max(seconds, 0.0)));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  return fmt::format("{}h{:02d}m", s / 3600, s % 3600 / 60);
}

}  // namespace

std::string progress_line(const std::string& label, std::uint64_t done, std::uint64_t total,
                          double seconds, double planned_seconds) {
  const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
  std::string line = label + "  " + format_size(done, true);
  double fraction = -1;  // not known
  double eta = -1;
  if (planned_seconds > 0) {
    fraction = seconds / planned_seconds;
    eta = planned_seconds - seconds;
  } else if (total > 0) {
    line += " / " + format_size(total, true);
    fraction = static_cast<double>(std::min(done, total)) / static_cast<double>(total);
    if (rate > 0) eta = static_cast<double>(total - std::min(done, total)) / rate;
  }
  if (fraction >= 0) {
    // Floor, so that 100% means done.
    line += fmt::format("  {:3.0f}%", std::floor(100 * std::clamp(fraction, 0.0, 1.0)));
  }
  line += "  " + (rate > 0 ? format_rate(rate) : std::string("-- B/s"));
  if (planned_seconds > 0 || total > 0) line += "  ETA " + (eta >= 0 ? eta_words(eta) : "--");
  return line;
}

bool progress_wanted(bool json) { return !json && isatty(STDERR_FILENO) != 0; }

ProgressBar::ProgressBar(std::string label, std::uint64_t total, bool enabled,
                         double planned_seconds)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled),
      planned_seconds_(planned_seconds) {}

ProgressBar::~ProgressBar() { clear(); }

void ProgressBar::update(std::uint64_t done) {
  if (!enabled_) return;
  const Clock::time_point now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (elapsed < kFirstFrame) return;
  if (drawn_ && std::chrono::duration<double>(now - last_draw_).count() < kRedraw) return;
  // \033[K erases the rest of the line: a shorter frame leaves nothing of the longer one.
  fmt::print(stderr, "\r{}\033[K", progress_line(label_, done, total_, elapsed, planned_seconds_));
  std::fflush(stderr);
  last_draw_ = now;
  drawn_ = true;
}

void ProgressBar::clear() {
  if (!drawn_) return;
  fmt::print(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace ferry::cli
