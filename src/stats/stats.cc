// ferry::stats() and the published segment's writer (docs/stats.md). Each thread that records a
// request owns one slot (a page) of the process's segment and is its only writer: a request's
// counts are plain loads and stores between two stores of the slot's sequence word, with no
// locked instruction and no allocation. stats() and outside readers sum the slots.
//
// The segment changes only under the registry lock: made at the first request (or at
// publish_stats(true)), replaced when a withdrawn or private segment is published (its counts
// carried into the new one's retired slot) and, in a child made by fork(), dropped so the child
// counts its own requests. Writers notice through the epoch word: each checks it before and after
// marking its slot busy, and the thread that replaces a segment changes the epoch, forces a
// barrier on every thread (membarrier) and waits for busy slots, so no count lands in a segment
// after it was copied.
#include "ferry/stats.h"

#include <pthread.h>
#include <sched.h>

#include <array>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "base/variables.h"
#include "stats/stats_layout.h"
#include "stats/stats_publish.h"
#include "stats/stats_recorder.h"
#include "stats/stats_sum.h"

namespace ferry {
namespace {

namespace L = statistics::stats_layout;
using Word = std::atomic<std::uint64_t>;
static_assert(Word::is_always_lock_free && sizeof(Word) == 8);

constexpr std::size_t kReasonCodes = static_cast<std::size_t>(ReasonCode::kRemoteSource) + 1;
static_assert(kReasonCodes == L::kReasonCodeCount, "every reason code needs a word");

Word* slot_of(const statistics::SegmentMemory& m, std::size_t i) {
  return m.words + L::kPageWords + i * L::kSlotWords;
}

// Only the slot's writer calls this: a load and a store, not a locked add.
inline __attribute__((always_inline)) void add(Word* s, std::size_t w, std::uint64_t n) {
  s[w].store(s[w].load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

struct Registry {
  std::mutex mu;
  std::mutex shared_mu;           // writers of the shared slot, one at a time
  statistics::SegmentMemory seg;  // words == nullptr until the first request
  std::vector<std::size_t> free_slots;
  std::size_t next_slot = L::kFirstThreadSlot;
  statistics::SlotSum baseline{};  // the counts at the last reset_stats()
  bool env_read = false;
  bool wanted = true;
  std::string why_not;
  bool warned_no_space = false;  // the warning is said once per process
  std::uint64_t counting_since_ns = 0;
  pid_t owner = 0;  // the process that made `seg`
  std::vector<statistics::SegmentMemory>
      retired_segments;  // replaced ones: still mapped, never reused
};

// Process-wide, outside the registry so that a request reaches them with no guard check: the
// segment every thread of the process counts in, and the number of times it was replaced.
std::atomic<std::uint64_t> epoch{1};
std::atomic<Word*> current_words{nullptr};

void at_exit(Registry* r) {
  // A process that ends normally removes its name; one killed leaves it to the next reader.
  if (r != nullptr && r->owner == ::getpid()) statistics::withdraw_segment(r->seg);
}

void in_child(Registry* r) {
  if (r == nullptr) return;  // forked while the registry was being made: nothing counted yet
  new (&r->mu) std::mutex;
  new (&r->shared_mu) std::mutex;
  // The parent's segment is the parent's: the child counts its own requests from zero, in a
  // segment of its own made at its first request. Only this thread exists now, and it is not
  // inside a write, so nothing touches the parent's pages after this.
  current_words.store(nullptr, std::memory_order_relaxed);
  epoch.fetch_add(1, std::memory_order_relaxed);
  if (r->seg.words != nullptr) statistics::unmap_segment(r->seg);
  r->seg = {};
  for (statistics::SegmentMemory& m : r->retired_segments) statistics::unmap_segment(m);
  r->retired_segments.clear();
  r->free_slots.clear();
  r->next_slot = L::kFirstThreadSlot;
  r->baseline = {};
  r->counting_since_ns = 0;
  r->owner = 0;
}

Registry& registry() {
  // Process-wide: the process publishes one segment, which `ferry stats -p PID` reads. Leaked on
  // purpose: threads exiting after main() still fold their slot in.
  static Registry* reg = [] {
    auto* made = new Registry;
    pthread_atfork(nullptr, nullptr, [] { in_child(reg); });
    std::atexit([] { at_exit(reg); });
    return made;
  }();
  return *reg;
}

void read_environment(Registry& r) {
  if (r.env_read) return;
  r.env_read = true;
  r.wanted = statistics::publish_from_environment(&r.why_not);
}

// A full stats directory costs `ferry stats -p` its view of this process, and nothing else: the
// counts go on in private memory. Said once per process, on stderr, since nobody else would know.
void warn_no_space(Registry& r) {
  if (std::exchange(r.warned_no_space, true)) return;
  std::fprintf(stderr, "ferry: warning: not publishing statistics: %s; counting privately\n",
               r.why_not.c_str());
}

// Under r.mu: the segment requests are counted in, made now if there is none.
void ensure_segment(Registry& r) {
  if (r.seg.words != nullptr) return;
  read_environment(r);
  const statistics::ProcessIdentity who = statistics::this_process();
  r.counting_since_ns = statistics::unix_now_ns();
  std::optional<statistics::SegmentMemory> m;
  if (r.wanted) {
    r.why_not.clear();
    const std::string dir = stats_directory();
    bool no_space = false;
    m = statistics::create_published_segment(dir, who, r.counting_since_ns, &r.why_not, &no_space);
    if (m) statistics::remove_dead_segments(dir, static_cast<std::uint32_t>(who.uid));
    if (no_space) warn_no_space(r);
  }
  r.seg = m ? *m : statistics::create_private_segment(who, r.counting_since_ns);
  r.owner = ::getpid();
  current_words.store(r.seg.words, std::memory_order_release);
  epoch.fetch_add(1, std::memory_order_release);
}

// One thread's slot. Trivially constructed; the destructor folds the slot into the retired one.
struct ThreadSlot {
  std::uint64_t epoch = 0;  // the epoch `words` belongs to; 0: none yet
  Word* words = nullptr;
  std::size_t index = 0;
  ~ThreadSlot();
};

// Adds slot `s` to `out`, from a copy taken between two updates of it.
void read_slot(const Word* s, statistics::SlotSum& out) {
  statistics::SlotSum v;
  for (;;) {
    const std::uint64_t begin = s[L::kSlotBegin].load(std::memory_order_acquire);
    for (std::size_t w = L::kSlotFirstData; w < L::kSlotUsedWords; ++w)
      v[w] = s[w].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s[L::kSlotEnd].load(std::memory_order_relaxed) == begin) break;
    sched_yield();  // its writer is inside an update (a few instructions)
  }
  for (std::size_t w = L::kSlotFirstData; w < L::kSlotUsedWords; ++w) out[w] += v[w];
}

// Marks slot `s` as inside an update; returns the version to close it with.
inline std::uint64_t open_update(Word* s) {
  const std::uint64_t v = s[L::kSlotBegin].load(std::memory_order_relaxed) + 1;
  s[L::kSlotEnd].store(v, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  return v;
}
inline void close_update(Word* s, std::uint64_t v) {
  s[L::kSlotBegin].store(v, std::memory_order_release);
}

// Under r.mu: every slot of the segment.
statistics::SlotSum sum_segment(const statistics::SegmentMemory& m) {
  statistics::SlotSum total{};
  if (m.words == nullptr) return total;
  const std::size_t high = m.words[L::kHHighWater].load(std::memory_order_acquire);
  for (std::size_t i = 0; i < high && i < m.slots; ++i) read_slot(slot_of(m, i), total);
  return total;
}

// Under r.mu: moves `from`'s counts into slot 0 and zeroes it, inside the fold sequence so that
// a reader never counts them twice or not at all.
void fold_into_retired(const statistics::SegmentMemory& m, Word* from) {
  Word* header = m.words;
  Word* retired = slot_of(m, L::kRetiredSlot);
  header[L::kHFold].fetch_add(1, std::memory_order_acq_rel);
  const std::uint64_t rv = open_update(retired);
  const std::uint64_t fv = open_update(from);
  for (std::size_t w = L::kSlotFirstData; w < L::kSlotUsedWords; ++w) {
    const std::uint64_t v = from[w].load(std::memory_order_relaxed);
    if (v == 0) continue;
    add(retired, w, v);
    from[w].store(0, std::memory_order_relaxed);
  }
  close_update(from, fv);
  close_update(retired, rv);
  header[L::kHFold].fetch_add(1, std::memory_order_acq_rel);
}

ThreadSlot::~ThreadSlot() {
  if (words == nullptr || index == L::kSharedSlot) return;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  // A slot of a replaced segment was copied when it was replaced.
  if (epoch != ::ferry::epoch.load(std::memory_order_relaxed) || r.seg.words == nullptr) {
    words = nullptr;
    epoch = 0;
    return;
  }
  fold_into_retired(r.seg, words);
  r.free_slots.push_back(index);
  // A thread_local destructor that runs later and records a request claims a slot afresh.
  words = nullptr;
  epoch = 0;
}

// Per thread by design: each thread is the one writer of its own slot.
thread_local ThreadSlot my_slot;

// Gives the thread a slot of the current segment (making it first if needed).
void claim(ThreadSlot& t) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  ensure_segment(r);
  std::size_t index = L::kSharedSlot;
  if (!r.free_slots.empty()) {
    index = r.free_slots.back();
    r.free_slots.pop_back();
  } else if (r.next_slot < r.seg.slots) {
    index = r.next_slot++;
    Word& high = r.seg.words[L::kHHighWater];
    if (high.load(std::memory_order_relaxed) < r.next_slot) {
      high.store(r.next_slot, std::memory_order_release);
    }
  }
  t.index = index;
  t.words = slot_of(r.seg, index);
  t.epoch = epoch.load(std::memory_order_relaxed);
}

#define FERRY_STATS_INLINE inline __attribute__((always_inline))

// One update of slot `s` by its writer; false (nothing counted) when the epoch moved from `e`.
template <typename Body>
FERRY_STATS_INLINE bool write_slot(Word* s, std::uint64_t e, const Body& body) {
  const std::uint64_t v = open_update(s);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  // The slot is marked busy before this second look: a thread replacing the segment either sees
  // the mark (and waits for it) or this sees its new epoch (heavy_barrier() in replace()).
  if (epoch.load(std::memory_order_relaxed) != e) [[unlikely]] {
    close_update(s, v);  // an update that changed nothing
    return false;
  }
  body(s);
  close_update(s, v);
  return true;
}

// Runs `body(slot)` as one update of this thread's slot.
template <typename Body>
FERRY_STATS_INLINE void update(const Body& body) {
  ThreadSlot& t = my_slot;
  for (;;) {
    const std::uint64_t e = epoch.load(std::memory_order_acquire);
    if (t.epoch != e) [[unlikely]] {
      claim(t);
      continue;
    }
    if (t.index == L::kSharedSlot) [[unlikely]] {
      // More threads than slots: the rest share one, a lock around each update.
      std::lock_guard lock(registry().shared_mu);
      if (write_slot(t.words, e, body)) return;
      continue;
    }
    if (write_slot(t.words, e, body)) return;
  }
}

// Under r.mu: counts from now on go to `next`, which gets every count of the current segment.
// False (nothing changed) when the other threads cannot be fenced.
bool replace(Registry& r, statistics::SegmentMemory next, std::string* why) {
  // Without the barrier a writer could still count in the old segment after it was copied.
  if (!statistics::heavy_barrier(why)) return false;
  statistics::SegmentMemory old = r.seg;
  current_words.store(next.words, std::memory_order_release);
  epoch.fetch_add(1, std::memory_order_seq_cst);
  if (!statistics::heavy_barrier(why)) {
    // It worked a moment ago; give every thread time to leave an update begun before.
    for (int i = 0; i < 100; ++i) sched_yield();
  }
  statistics::SlotSum carried = sum_segment(old);  // waits for slots inside an update
  Word* retired = slot_of(next, L::kRetiredSlot);
  for (std::size_t w = L::kSlotFirstData; w < L::kSlotUsedWords; ++w) {
    retired[w].store(carried[w], std::memory_order_relaxed);
  }
  next.words[L::kHFlags].store(old.words[L::kHFlags].load(std::memory_order_relaxed),
                               std::memory_order_relaxed);
  r.seg = next;
  r.free_slots.clear();
  r.next_slot = L::kFirstThreadSlot;
  // Threads that began an update before the epoch moved may still touch the old slots' sequence
  // words: the old memory stays mapped.
  r.retired_segments.push_back(old);
  return true;
}

PublishStatus status_locked(Registry& r) {
  PublishStatus s;
  s.wanted = r.wanted;
  s.published = !r.seg.path.empty();
  s.path = r.seg.path;
  if (!s.published) {
    s.why_not = r.why_not;
    if (s.why_not.empty() && r.seg.words == nullptr) {
      s.why_not = "nothing published yet: the segment is made at the first request";
    }
  }
  return s;
}

}  // namespace

namespace statistics {

void record_request(const RouteReport& report, bool failed) {
  const std::size_t route = report.cufile_tasks > 0 ? 1 : 0;
  const std::size_t bucket =
      is_gpu(report.memory)
          ? (report.device >= 0 ? L::device_bucket(report.device) : L::kUnrecordedBucket)
          : L::kHostBucket;
  const bool read = report.op == Op::kRead;
  const std::size_t op = read ? 0 : 1;
  const std::uint64_t ns = static_cast<std::uint64_t>(report.seconds * 1e9);
  update([&](Word* s) {
    add(s, L::route_word(bucket, route, read ? L::kReads : L::kWrites), 1);
    if (failed) add(s, L::route_word(bucket, route, L::kFailed), 1);
    add(s, L::route_word(bucket, route, read ? L::kBytesRead : L::kBytesWritten), report.bytes);
    if (report.posix_tasks != 0) add(s, L::route_word(bucket, 0, L::kTasks), report.posix_tasks);
    if (report.cufile_tasks != 0) {
      add(s, L::route_word(bucket, 1, L::kTasks), report.cufile_tasks);
    }
    add(s, L::bucket_word(bucket, L::kNvfs), report.cufile.nvfs);
    add(s, L::bucket_word(bucket, L::kCompat), report.cufile.posix);
    add(s, L::bucket_word(bucket, L::kP2p), report.cufile.p2p);
    if (report.cufile.shared_window) add(s, L::bucket_word(bucket, L::kSharedWindows), 1);
    for (const RouteReason& reason : report.reasons) {
      add(s, L::reason_word(route, static_cast<std::size_t>(reason.code)), 1);
    }
    add(s, L::hist_word(route, op, L::latency_bucket(ns)), 1);
    add(s, L::op_ns_word(route, op), ns);
    if (report.direct_tasks != 0) add(s, L::kSlotDirectTasks, report.direct_tasks);
  });
}

namespace {

// record_small_request(), and with `end` the end of the `started` bytes in the same update.
FERRY_STATS_INLINE void record_small(Op op, std::uint64_t bytes, std::uint64_t nanoseconds,
                                     ReasonCode layer1, bool cold_direct, int device, bool end,
                                     std::uint64_t started) {
  std::size_t bucket;
  if (device != kDeviceNotRecorded) {
    bucket = L::device_bucket(device);
  } else {
    bucket = layer1 == ReasonCode::kHostBuffer || layer1 == ReasonCode::kNoCudaDriver
                 ? L::kHostBucket
                 : L::kUnrecordedBucket;
  }
  // Every word this request adds to, worked out before the update: 4 cache lines of the slot.
  const bool read = op == Op::kRead;
  const std::size_t o = read ? 0 : 1;
  const std::size_t count_w = L::route_word(bucket, 0, read ? L::kReads : L::kWrites);
  const std::size_t bytes_w = L::route_word(bucket, 0, read ? L::kBytesRead : L::kBytesWritten);
  const std::size_t tasks_w = L::route_word(bucket, 0, L::kTasks);
  const std::size_t layer1_w = L::reason_word(0, static_cast<std::size_t>(layer1));
  constexpr std::size_t engine_w = L::reason_word(0, static_cast<std::size_t>(ReasonCode::kEngine));
  constexpr std::size_t cold_w =
      L::reason_word(0, static_cast<std::size_t>(ReasonCode::kColdDirect));
  const std::size_t hist_w = L::hist_word(0, o, L::latency_bucket(nanoseconds));
  const std::size_t ns_w = L::op_ns_word(0, o);
  update([=](Word * s) __attribute__((always_inline)) {
    add(s, ns_w, nanoseconds);
    add(s, count_w, 1);
    add(s, bytes_w, bytes);
    add(s, tasks_w, 1);
    add(s, layer1_w, 1);
    add(s, engine_w, 1);
    if (cold_direct) add(s, cold_w, 1);
    add(s, hist_w, 1);
    if (end) {
      add(s, L::kSlotEndedRequests, 1);
      add(s, L::kSlotEndedBytes, started);
    }
  });
}

}  // namespace

void record_small_request(Op op, std::uint64_t bytes, std::uint64_t nanoseconds, ReasonCode layer1,
                          bool cold_direct, int device) {
  record_small(op, bytes, nanoseconds, layer1, cold_direct, device, false, 0);
}

void end_small_request(Op op, std::uint64_t bytes, std::uint64_t nanoseconds, ReasonCode layer1,
                       bool cold_direct, int device, std::uint64_t started) {
  record_small(op, bytes, nanoseconds, layer1, cold_direct, device, true, started);
}

void note_request_started(std::uint64_t bytes) {
  update([&](Word* s) {
    add(s, L::kSlotStartedRequests, 1);
    add(s, L::kSlotStartedBytes, bytes);
  });
  Word* header = current_words.load(std::memory_order_acquire);
  if (header != nullptr &&
      (header[L::kHFlags].load(std::memory_order_relaxed) & L::kFlagInflightFed) == 0) {
    header[L::kHFlags].fetch_or(L::kFlagInflightFed, std::memory_order_relaxed);
  }
}

void note_request_ended(std::uint64_t bytes) {
  update([&](Word* s) {
    add(s, L::kSlotEndedRequests, 1);
    add(s, L::kSlotEndedBytes, bytes);
  });
}

Stats stats_from_sum(const SlotSum& t) {
  Stats out;
  std::array<std::uint64_t, kReasonCodes> reasons{};
  for (std::size_t b = 0; b < L::kBuckets; ++b) {
    for (std::size_t route = 0; route < L::kRoutes; ++route) {
      out.requests +=
          t[L::route_word(b, route, L::kReads)] + t[L::route_word(b, route, L::kWrites)];
      out.failed_requests += t[L::route_word(b, route, L::kFailed)];
      out.bytes_read += t[L::route_word(b, route, L::kBytesRead)];
      out.bytes_written += t[L::route_word(b, route, L::kBytesWritten)];
      (route == 0 ? out.posix_tasks : out.cufile_tasks) += t[L::route_word(b, route, L::kTasks)];
    }
    out.nvfs_pieces += t[L::bucket_word(b, L::kNvfs)];
    out.compat_pieces += t[L::bucket_word(b, L::kCompat)];
    out.p2p_pieces += t[L::bucket_word(b, L::kP2p)];
    out.shared_windows += t[L::bucket_word(b, L::kSharedWindows)];
  }
  std::uint64_t ns = 0;
  for (std::size_t route = 0; route < L::kRoutes; ++route) {
    for (std::size_t op = 0; op < L::kOps; ++op) ns += t[L::op_ns_word(route, op)];
    for (std::size_t c = 0; c < kReasonCodes; ++c) reasons[c] += t[L::reason_word(route, c)];
  }
  out.seconds = static_cast<double>(ns) / 1e9;
  for (std::size_t c = 0; c < kReasonCodes; ++c) {
    if (reasons[c] != 0) out.reasons[to_string(static_cast<ReasonCode>(c))] = reasons[c];
  }
  return out;
}

}  // namespace statistics

Stats stats() {
  Registry& r = registry();
  statistics::SlotSum t;
  {
    std::lock_guard lock(r.mu);
    t = sum_segment(r.seg);
    for (std::size_t w = 0; w < t.size(); ++w) t[w] -= r.baseline[w];
  }
  return statistics::stats_from_sum(t);
}

void reset_stats() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.baseline = sum_segment(r.seg);
}

PublishStatus publish_stats(bool on) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  read_environment(r);
  r.wanted = on;
  r.why_not.clear();
  if (!on) {
    statistics::withdraw_segment(r.seg);
    r.why_not = "withdrawn: publish_stats(false)";
    return status_locked(r);
  }
  if (r.seg.words == nullptr) {
    ensure_segment(r);
    return status_locked(r);
  }
  if (!r.seg.path.empty()) return status_locked(r);
  // A private or withdrawn segment: publish a new one that carries its counts.
  const statistics::ProcessIdentity who = statistics::this_process();
  bool no_space = false;
  std::optional<statistics::SegmentMemory> next = statistics::create_published_segment(
      stats_directory(), who, r.counting_since_ns, &r.why_not, &no_space);
  if (no_space) warn_no_space(r);
  if (!next) return status_locked(r);
  std::string why;
  if (!replace(r, *next, &why)) {
    statistics::withdraw_segment(*next);
    statistics::unmap_segment(*next);
    r.why_not = "cannot carry the counts into a new segment: " + why;
  }
  return status_locked(r);
}

PublishStatus publish_status() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  read_environment(r);
  return status_locked(r);
}

std::string stats_directory() { return base::read(base::kStatsDir).value; }

std::string Stats::to_json() const {
  nlohmann::json j = {{"requests", requests},       {"failed_requests", failed_requests},
                      {"bytes_read", bytes_read},   {"bytes_written", bytes_written},
                      {"posix_tasks", posix_tasks}, {"cufile_tasks", cufile_tasks},
                      {"nvfs_pieces", nvfs_pieces}, {"compat_pieces", compat_pieces},
                      {"p2p_pieces", p2p_pieces},   {"shared_windows", shared_windows},
                      {"seconds", seconds},         {"reasons", reasons}};
  return j.dump();
}

}  // namespace ferry
