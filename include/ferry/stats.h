// Process-wide counters of every request ferry served, with the same fields as the route
// report. Updated when each request completes; thread-safe.
//
// Every process that makes requests also publishes its counters in a small shared-memory
// segment of its own, /dev/shm/ferry.<uid>.<pid> (mode 0600), so that `ferry stats -p PID` and
// read_process_stats() can read them from outside it (docs/stats.md). FERRY_STATS_PUBLISH=0
// turns that off; publish_stats() turns it on or off at run time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ferry/error.h"

namespace ferry {

struct Stats {
  std::uint64_t requests = 0;
  std::uint64_t failed_requests = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t posix_tasks = 0;
  std::uint64_t cufile_tasks = 0;
  std::uint64_t nvfs_pieces = 0;
  std::uint64_t compat_pieces = 0;
  std::uint64_t p2p_pieces = 0;
  // cuFile requests whose layer-2 counts covered a window shared with another request.
  std::uint64_t shared_windows = 0;
  double seconds = 0;
  // Requests per reason code name (to_string(ReasonCode)).
  std::map<std::string, std::uint64_t> reasons;

  std::string to_json() const;
};

// This process's counters since it started, or since the last reset_stats().
Stats stats();
// Sets stats() to zero. What the process publishes is not reset: published counters only grow,
// as readers that compute rates (and Prometheus) expect.
void reset_stats();

// --- Publishing this process's counters -------------------------------------------------------

struct PublishStatus {
  bool wanted = false;     // FERRY_STATS_PUBLISH and publish_stats() say to publish
  bool published = false;  // a segment is readable under `path` now
  std::string path;        // the segment's file, when published
  std::string why_not;     // when wanted but not published (or why it is not wanted)
};

// Publishes (true) or withdraws (false) this process's segment now; the counters go on either
// way, and stats() does not change. Publishing again after a withdrawal makes a new segment that
// carries every count since the process started. Failures (no /dev/shm, a name taken) are not
// exceptions: the returned status says why.
PublishStatus publish_stats(bool on);
PublishStatus publish_status();

// --- Reading another process's counters -------------------------------------------------------

// Requests and bytes of one path (ferry's POSIX path or cuFile) for one memory, or in all.
struct RouteCounters {
  std::uint64_t reads = 0;
  std::uint64_t writes = 0;
  std::uint64_t failed = 0;
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t tasks = 0;
  std::uint64_t requests() const { return reads + writes; }
};

// Request durations: counts[b] requests took more than bound(b-1) and at most bound(b) seconds;
// the last bucket has no upper bound.
struct LatencyHistogram {
  static constexpr std::size_t kBuckets = 32;
  std::array<std::uint64_t, kBuckets> counts{};
  static double bound(std::size_t bucket);  // 1.024 us << bucket; infinity for the last
  std::uint64_t total() const;
  // The upper bound of the bucket that holds the q-quantile (0 < q <= 1); 0 when empty.
  double quantile(double q) const;
};

// One path at the process level: its counters, the reasons that sent requests to it (by
// to_string(ReasonCode) name; one request counts once per reason it gave) and its latencies.
struct PathCounters {
  RouteCounters counts;
  std::map<std::string, std::uint64_t> reasons;
  LatencyHistogram read_latency;
  LatencyHistogram write_latency;
  double read_seconds = 0;  // summed durations of the reads, and of the writes
  double write_seconds = 0;
  double seconds() const { return read_seconds + write_seconds; }
};

// One memory's counters at both layers.
struct MemoryCounters {
  static constexpr int kHost = -1;
  static constexpr int kHigherGpu = -2;   // a GPU of ordinal 16 or more
  static constexpr int kUnrecorded = -3;  // the recorder did not say which memory
  int device = kHost;                     // GPU ordinal, or one of the above
  std::string name;                       // "host", "gpu 0", "gpu 16+", "not recorded"
  RouteCounters posix;
  RouteCounters cufile;
  // Layer 2: cuFile's pieces for this memory.
  std::uint64_t nvfs_pieces = 0;
  std::uint64_t compat_pieces = 0;
  std::uint64_t p2p_pieces = 0;
  std::uint64_t shared_windows = 0;
};

// Another segment named for the same pid as the one read (a forgery, a stale one), and what it
// is: `state` is a ProcessEntry state's name ("corrupt", "removed", ...), `detail` says why.
struct OtherSegment {
  std::string path;
  std::string state;
  std::string detail;
};

struct ProcessStats {
  int pid = 0;
  std::uint32_t uid = 0;
  std::string command;  // the process's name when it began publishing
  std::string path;     // the segment read
  std::uint64_t layout_version = 0;
  std::string ferry_version;
  double process_started = 0;  // unix seconds
  double counting_since = 0;   // unix seconds: when the process began counting
  double read_at = 0;          // unix seconds: when this snapshot was taken
  bool exited = false;         // the process is gone: these are its last counters
  Stats totals;                // the fields of ferry::stats(), since counting_since
  PathCounters posix;
  PathCounters cufile;
  std::vector<MemoryCounters> memories;  // those with any request: host, then GPUs
  std::uint64_t direct_tasks = 0;        // POSIX tasks read with O_DIRECT (cold pages)
  // Requests begun and not yet ended, where the engine reports request starts.
  bool inflight_known = false;
  std::uint64_t inflight_requests = 0;
  std::uint64_t inflight_bytes = 0;
  // read_process_stats: the other segments named for this pid (not read as its counters).
  std::vector<OtherSegment> other_segments;

  std::string to_json() const;
  // Lines for people, in the words of the route report (layer 1, layer 2, reason codes).
  std::string to_text() const;
};

// Why a process's counters could not be read.
class StatsError : public Error {
 public:
  enum class Kind {
    kNoProcess,         // no such process, and no segment
    kNotPublished,      // the process exists but publishes no segment
    kPermissionDenied,  // the segment belongs to another user
    kCorrupt,           // the segment is not a valid one (or not a regular 0600 file)
    kBusy,              // its counters kept changing mid-read
    kUnavailable,       // the stats directory cannot be read
  };
  StatsError(Kind kind, int pid, const std::string& message);
  Kind kind() const { return kind_; }
  int pid() const { return pid_; }

 private:
  Kind kind_;
  int pid_;
};
std::string to_string(StatsError::Kind kind);  // "no_process", "permission_denied", ...

// Where segments live: FERRY_STATS_DIR, else /dev/shm.
std::string stats_directory();

// Reads process `pid`'s segment from `directory` (default stats_directory()). A segment left by
// a process that has exited is read once more (exited = true) and removed. Throws StatsError.
ProcessStats read_process_stats(int pid, const std::string& directory = {});

// Every segment in the directory, readable or not. Segments of processes that have exited are
// removed (where this user may) and listed once as removed.
struct ProcessEntry {
  enum class State { kReadable, kPermissionDenied, kCorrupt, kBusy, kRemoved, kStale };
  int pid = 0;
  std::uint32_t uid = 0;
  State state = State::kReadable;
  std::string path;
  std::string detail;                 // why, for every state but kReadable
  std::optional<ProcessStats> stats;  // kReadable
};
std::string to_string(ProcessEntry::State state);  // "readable", "permission_denied", ...
std::vector<ProcessEntry> list_process_stats(const std::string& directory = {});

// The OpenMetrics text exposition of these processes' counters (ends with "# EOF").
std::string to_openmetrics(const std::vector<ProcessStats>& processes);

}  // namespace ferry
