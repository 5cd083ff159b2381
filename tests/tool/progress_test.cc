// The CLI's progress line (tools/ferry/progress.cc): bytes, percentage, rate and ETA as a pure
// function of the bytes, the total and the seconds.
#include "progress.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace ferry::cli {
namespace {

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

TEST(ProgressLine, ShowsBytesOfTotalPercentRateAndEta) {
  // 2 GiB in 1 s: 2.15 GB/s, and 6 GiB more take 3 s.
  EXPECT_EQ(progress_line("reading", 2 * kGiB, 8 * kGiB, 1.0),
            "reading  2.00 GiB / 8.00 GiB   25%  2.15 GB/s  ETA 3s");
}

// What follows "ETA " in a line.
std::string eta(const std::string& line) { return line.substr(line.rfind("ETA ") + 4); }

TEST(ProgressLine, RoundsTheEtaUpToWholeSecondsMinutesAndHours) {
  // At 1 MB/s the seconds left are the bytes left / 1e6.
  EXPECT_EQ(progress_line("l", 1'000'000, 3'100'000, 1.0),
            "l  977 KiB / 2.96 MiB   32%  1.00 MB/s  ETA 3s");
  EXPECT_EQ(eta(progress_line("l", 1'000'000, 66'000'000, 1.0)), "1m05s");
  EXPECT_EQ(eta(progress_line("l", 1'000'000, 7'381'000'000, 1.0)), "2h03m");
  // Less than a second left still says a second (and 99%, not 100%); nothing left says 0s.
  EXPECT_EQ(progress_line("l", 1'000'000, 1'000'001, 1.0),
            "l  977 KiB / 977 KiB   99%  1.00 MB/s  ETA 1s");
  EXPECT_EQ(progress_line("l", 1'000'000, 1'000'000, 1.0),
            "l  977 KiB / 977 KiB  100%  1.00 MB/s  ETA 0s");
}

TEST(ProgressLine, AnUnknownTotalShowsBytesAndRateOnly) {
  EXPECT_EQ(progress_line("reading", 12 << 20, 0, 2.0), "reading  12.0 MiB  6.29 MB/s");
}

TEST(ProgressLine, BeforeTheFirstByteTheRateAndEtaAreUnknown) {
  EXPECT_EQ(progress_line("loading", 0, 8 * kGiB, 0.4),
            "loading  0 B / 8.00 GiB    0%  -- B/s  ETA --");
  EXPECT_EQ(progress_line("loading", 0, 0, 0), "loading  0 B  -- B/s");
}

TEST(ProgressLine, MoreBytesThanTheTotalStopAtAHundredPercent) {
  EXPECT_EQ(progress_line("w", 3000, 2000, 1.0), "w  2.93 KiB / 1.95 KiB  100%  3.00 kB/s  ETA 0s");
}

TEST(ProgressLine, ATimedRunTakesItsPercentageAndEtaFromTheClock) {
  // bench --seconds 10, 2 s in: 20%, 8 s to go, whatever the bytes.
  EXPECT_EQ(progress_line("read 4 KiB", 4'000'000, 0, 2.0, 10.0),
            "read 4 KiB  3.81 MiB   20%  2.00 MB/s  ETA 8s");
}

}  // namespace
}  // namespace ferry::cli
