// The engine's side of ferry::stats(): adds a finished request to the counters of the thread
// that finished it (no lock; stats() sums every thread's counters).
#pragma once

#include <cstdint>

#include "ferry/route.h"

namespace ferry::core {

void record_request(const RouteReport& report, bool failed);
// A one-task request that ran in its caller's thread on ferry's POSIX path, recorded without
// building its report: the same counts record_request() would add for it.
void record_small_request(Op op, std::uint64_t bytes, std::uint64_t nanoseconds, ReasonCode layer1,
                          bool cold_direct);

}  // namespace ferry::core
