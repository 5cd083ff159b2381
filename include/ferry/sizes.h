// Sizes and rates in words, ferry's one form for each. Sizes in binary units (B, KiB, MiB, ...):
// exact, the largest unit the size is whole in, which parse_size reads back (format_size(bytes)
// in ferry/settings.h: 4194304 -> "4 MiB", 5000 -> "5000 B"); rounded, for running totals
// (stats, progress), three significant digits of the largest unit reached. Rates in decimal
// units, three significant digits. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace ferry {

// rounded: 4917248 -> "4.69 MiB", 4194304 -> "4.00 MiB", 512 -> "512 B"; else format_size(bytes).
std::string format_size(std::uint64_t bytes, bool rounded);
// "2.45 GB/s", "312 MB/s", "18.0 kB/s", "12.0 B/s".
std::string format_rate(double bytes_per_s);

}  // namespace ferry
