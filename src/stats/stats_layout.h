// The layout of a process's published counters (docs/stats.md), shared by the writer (stats.cc,
// stats_publish.cc) and the reader (stats_segment.cc). A segment is an array of 64-bit words:
// a header page, then kSlots slots of one page each. Slot 0 holds what exited threads left (and
// what a segment taken over from an earlier one held), slot 1 is shared by the threads that found
// no slot of their own, slots 2.. belong to one thread each. Each slot is a seqlock with one
// writer and two version words: an update stores `end` (v + 1) first, then the counters, then
// `begin` (v + 1). A reader that finds begin == end, copies the slot, and then finds both still
// unchanged has a copy of no update's middle. The header's fold word is odd while a thread's
// counters move into slot 0.
//
// Any change to these numbers is a new kVersion: a reader checks every field of the header
// against the constants below and refuses a segment that differs.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace ferry::statistics::stats_layout {

inline constexpr std::uint64_t kMagic = 0x3154535952524546ull;  // "FERRYST1" little-endian
inline constexpr std::uint64_t kVersion = 1;
inline constexpr std::size_t kWordBytes = 8;
inline constexpr std::size_t kPageWords = 512;
inline constexpr std::size_t kHeaderBytes = kPageWords * kWordBytes;  // 4096
inline constexpr std::size_t kSlotWords = kPageWords;
inline constexpr std::size_t kSlotBytes = kSlotWords * kWordBytes;  // 4096
inline constexpr std::size_t kSlots = 128;
inline constexpr std::size_t kRetiredSlot = 0;
inline constexpr std::size_t kSharedSlot = 1;
inline constexpr std::size_t kFirstThreadSlot = 2;
inline constexpr std::size_t kSegmentBytes = kHeaderBytes + kSlots * kSlotBytes;

// Memories: host, GPU 0..kMaxGpus-1, a GPU of a higher ordinal, memory not recorded (a request
// whose recorder did not say which memory it used).
inline constexpr std::size_t kMaxGpus = 16;
inline constexpr std::size_t kHostBucket = 0;
inline constexpr std::size_t kOtherGpuBucket = 1 + kMaxGpus;
inline constexpr std::size_t kUnrecordedBucket = 2 + kMaxGpus;
inline constexpr std::size_t kBuckets = 3 + kMaxGpus;  // 19

inline constexpr std::size_t kRoutes = 2;  // 0: ferry's POSIX path, 1: cuFile
inline constexpr std::size_t kOps = 2;     // 0: read, 1: write
inline constexpr std::size_t kReasonWords = 16;
inline constexpr std::size_t kHistBuckets = 32;

// Header words.
enum HeaderWord : std::size_t {
  kHMagic,
  kHVersion,
  kHHeaderBytes,
  kHSlotBytes,
  kHSlotCount,
  kHSegmentBytes,
  kHBuckets,
  kHReasonWords,
  kHHistBuckets,
  kHHighWater,  // slots 0..high_water-1 may be non-zero
  kHPid,
  kHUid,
  kHStartTicks,        // the process's start time, /proc/<pid>/stat field 22 (pid reuse guard)
  kHProcessStartedNs,  // unix ns, derived from the start ticks and the boot time
  kHCountingSinceNs,   // unix ns: when this process's counters began
  kHFold,              // odd while a slot's counters move into the retired slot
  kHFlags,
  kHFerryVersion,  // major << 32 | minor << 16 | patch
  kHComm,          // kCommWords words: the process name, NUL-padded
};
inline constexpr std::size_t kCommWords = 4;
inline constexpr std::size_t kHeaderUsedWords = kHComm + kCommWords;
inline constexpr std::uint64_t kFlagInflightFed = 1;  // a request start was ever noted

// Slot words, laid out so that one request touches few cache lines of its thread's page: the
// versions and the durations share the first line; a memory's POSIX counters share one line.
enum RouteField : std::size_t {
  kReads,
  kWrites,
  kFailed,
  kBytesRead,
  kBytesWritten,
  kTasks,
  kRouteFields
};
inline constexpr std::size_t kNvfs = kRoutes * kRouteFields;  // then compat, p2p, shared windows
inline constexpr std::size_t kCompat = kNvfs + 1;
inline constexpr std::size_t kP2p = kNvfs + 2;
inline constexpr std::size_t kSharedWindows = kNvfs + 3;
inline constexpr std::size_t kBucketWords = kSharedWindows + 1;  // 16: two cache lines

inline constexpr std::size_t kSlotBegin = 0;          // version, stored last in an update
inline constexpr std::size_t kSlotEnd = 1;            // version, stored first
inline constexpr std::size_t kSlotFirstData = 2;      // words before it are versions
inline constexpr std::size_t kSlotOpNanoseconds = 2;  // [route][op]: summed durations
inline constexpr std::size_t kSlotDirectTasks = kSlotOpNanoseconds + kRoutes * kOps;
inline constexpr std::size_t kSlotReasons = 8;
inline constexpr std::size_t kSlotHist = kSlotReasons + kRoutes * kReasonWords;
inline constexpr std::size_t kSlotStartedRequests = kSlotHist + kRoutes * kOps * kHistBuckets;
inline constexpr std::size_t kSlotStartedBytes = kSlotStartedRequests + 1;
inline constexpr std::size_t kSlotEndedRequests = kSlotStartedRequests + 2;
inline constexpr std::size_t kSlotEndedBytes = kSlotStartedRequests + 3;
inline constexpr std::size_t kSlotBuckets = kSlotStartedRequests + 8;
inline constexpr std::size_t kSlotUsedWords = kSlotBuckets + kBuckets * kBucketWords;
static_assert(kSlotDirectTasks < kSlotReasons);
static_assert(kSlotUsedWords <= kSlotWords);
static_assert(kSlotReasons % 8 == 0 && kSlotHist % 8 == 0 && kSlotBuckets % 8 == 0);
static_assert(kHeaderUsedWords <= kPageWords);

// Where each reason code (ReasonCode's order) is counted in its path's block of reason words:
// "engine", which every request gives, in the same line as the layer-1 codes. A code added later
// takes a word no earlier code used, so readers and segments of either age agree (a reader
// counts the codes it knows; an older segment's word of a newer code is 0).
inline constexpr std::size_t kReasonPosition[] = {8, 1, 2, 3, 4, 5, 6, 7, 9, 0, 10};
inline constexpr std::size_t kReasonCodeCount = sizeof kReasonPosition / sizeof kReasonPosition[0];
static_assert(kReasonCodeCount <= kReasonWords);

constexpr std::size_t bucket_word(std::size_t bucket, std::size_t field) {
  return kSlotBuckets + bucket * kBucketWords + field;
}
constexpr std::size_t route_word(std::size_t bucket, std::size_t route, RouteField field) {
  return bucket_word(bucket, route * kRouteFields + field);
}
// `code` is a ReasonCode's number.
constexpr std::size_t reason_word(std::size_t route, std::size_t code) {
  return kSlotReasons + route * kReasonWords + kReasonPosition[code];
}
constexpr std::size_t hist_word(std::size_t route, std::size_t op, std::size_t bucket) {
  return kSlotHist + (route * kOps + op) * kHistBuckets + bucket;
}
constexpr std::size_t op_ns_word(std::size_t route, std::size_t op) {
  return kSlotOpNanoseconds + route * kOps + op;
}

// The memory bucket of a device ordinal (-1: host memory).
constexpr std::size_t device_bucket(int device) {
  if (device == -1) return kHostBucket;
  if (device >= 0 && device < static_cast<int>(kMaxGpus))
    return 1 + static_cast<std::size_t>(device);
  if (device >= 0) return kOtherGpuBucket;
  return kUnrecordedBucket;
}

// Latency bucket b counts requests of at most 1024 ns << b; the last one has no bound.
constexpr std::size_t latency_bucket(std::uint64_t nanoseconds) {
  const std::size_t b =
      static_cast<std::size_t>(std::bit_width(nanoseconds == 0 ? 0 : (nanoseconds - 1) >> 10));
  return b < kHistBuckets ? b : kHistBuckets - 1;
}

// The segment's file name in the stats directory: ferry.<uid>.<pid>.
inline constexpr const char* kNamePrefix = "ferry.";

}  // namespace ferry::statistics::stats_layout
