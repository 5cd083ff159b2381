// The engine's side of ferry::stats(): adds a finished request to the counters of the thread
// that finished it (no lock, no allocation; stats() sums every thread's counters). The counters
// live in the process's published segment (docs/stats.md), one page per thread.
#pragma once

#include <climits>
#include <cstdint>

#include "ferry/route.h"

namespace ferry::statistics {

// Passed for `device` when the caller does not say which memory a request used.
inline constexpr int kDeviceNotRecorded = INT_MIN;

void record_request(const RouteReport& report, bool failed);
// A one-task request that ran in its caller's thread on ferry's POSIX path, recorded without
// building its report: the same counts record_request() would add for it. `device` is the
// memory's GPU ordinal, -1 for host memory; without it, host-buffer and no-driver requests count
// as host memory and the others as memory not recorded.
void record_small_request(Op op, std::uint64_t bytes, std::uint64_t nanoseconds, ReasonCode layer1,
                          bool cold_direct, int device = kDeviceNotRecorded);
// record_small_request() and note_request_ended(started) in one update of the thread's counters:
// the small path's end (two updates were 35 of its instructions, bench/NOTES.md, "Small requests on
// one thread, round 2").
void end_small_request(Op op, std::uint64_t bytes, std::uint64_t nanoseconds, ReasonCode layer1,
                       bool cold_direct, int device, std::uint64_t started);

// Bytes in flight: a request's start and its end, in any threads, each exactly once per request
// (the end after record_request or record_small_request). Until the first start is noted, readers
// say that bytes in flight are not counted.
void note_request_started(std::uint64_t bytes);
void note_request_ended(std::uint64_t bytes);

}  // namespace ferry::statistics
