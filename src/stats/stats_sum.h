// The sum of a segment's slots, word by word (stats_layout.h), and the Stats it stands for:
// shared by stats() and by the reader of other processes' segments.
#pragma once

#include <array>
#include <cstdint>

#include "ferry/stats.h"
#include "stats/stats_layout.h"

namespace ferry::statistics {

using SlotSum = std::array<std::uint64_t, stats_layout::kSlotWords>;

Stats stats_from_sum(const SlotSum& sum);

}  // namespace ferry::statistics
