#include "ferry/stats.h"

#include <pthread.h>

#include <array>
#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/stats_recorder.h"

namespace ferry {
namespace {

constexpr std::size_t kReasonCodes = static_cast<std::size_t>(ReasonCode::kEngine) + 1;

enum Field : std::size_t {
  kRequests,
  kFailed,
  kBytesRead,
  kBytesWritten,
  kPosixTasks,
  kCufileTasks,
  kNvfs,
  kCompat,
  kP2p,
  kSharedWindows,
  kNanoseconds,
  kFields
};

using Totals = std::array<std::uint64_t, kFields + kReasonCodes>;

// One thread's counters. Only its thread writes them (load, add, store: no locked instruction on
// the request path); readers sum every shard. Atomics make those reads well-defined.
struct Shard {
  std::array<std::atomic<std::uint64_t>, kFields + kReasonCodes> v{};
  void add(std::size_t i, std::uint64_t n) {
    v[i].store(v[i].load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
};

// The live shards, what exited threads left, and the totals at the last reset_stats().
struct Registry {
  std::mutex mu;
  std::vector<Shard*> live;
  Totals retired{};
  Totals baseline{};
};

Registry* instance = nullptr;

Registry& registry() {
  // Leaked on purpose: threads exiting after main() still fold their shard in.
  static Registry* r = [] {
    instance = new Registry;
    // A thread of the parent may hold the lock at fork(): the child starts with a free one.
    pthread_atfork(nullptr, nullptr, [] { new (&instance->mu) std::mutex; });
    return instance;
  }();
  return *r;
}

struct ThreadShard {
  Shard shard;
  ThreadShard() {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    r.live.push_back(&shard);
  }
  ~ThreadShard() {
    Registry& r = registry();
    std::lock_guard lock(r.mu);
    for (std::size_t i = 0; i < r.retired.size(); ++i) {
      r.retired[i] += shard.v[i].load(std::memory_order_relaxed);
    }
    std::erase(r.live, &shard);
  }
};

Shard& my_shard() {
  thread_local ThreadShard mine;
  return mine.shard;
}

// Under r.mu.
Totals sum(Registry& r) {
  Totals t = r.retired;
  for (const Shard* s : r.live) {
    for (std::size_t i = 0; i < t.size(); ++i) t[i] += s->v[i].load(std::memory_order_relaxed);
  }
  return t;
}

}  // namespace

namespace core {

void record_request(const RouteReport& report, bool failed) {
  Shard& s = my_shard();
  s.add(kRequests, 1);
  if (failed) s.add(kFailed, 1);
  s.add(report.op == Op::kRead ? kBytesRead : kBytesWritten, report.bytes);
  s.add(kPosixTasks, report.posix_tasks);
  s.add(kCufileTasks, report.cufile_tasks);
  s.add(kNvfs, report.cufile.nvfs);
  s.add(kCompat, report.cufile.posix);
  s.add(kP2p, report.cufile.p2p);
  if (report.cufile.shared_window) s.add(kSharedWindows, 1);
  s.add(kNanoseconds, static_cast<std::uint64_t>(report.seconds * 1e9));
  for (const RouteReason& r : report.reasons) s.add(kFields + static_cast<std::size_t>(r.code), 1);
}

void record_small_request(Op op, std::uint64_t bytes, std::uint64_t nanoseconds, ReasonCode layer1,
                          bool cold_direct) {
  Shard& s = my_shard();
  s.add(kRequests, 1);
  s.add(op == Op::kRead ? kBytesRead : kBytesWritten, bytes);
  s.add(kPosixTasks, 1);
  s.add(kNanoseconds, nanoseconds);
  s.add(kFields + static_cast<std::size_t>(layer1), 1);
  s.add(kFields + static_cast<std::size_t>(ReasonCode::kEngine), 1);
  if (cold_direct) s.add(kFields + static_cast<std::size_t>(ReasonCode::kColdDirect), 1);
}

}  // namespace core

Stats stats() {
  Registry& r = registry();
  Totals t;
  {
    std::lock_guard lock(r.mu);
    t = sum(r);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] -= r.baseline[i];
  }
  Stats out;
  out.requests = t[kRequests];
  out.failed_requests = t[kFailed];
  out.bytes_read = t[kBytesRead];
  out.bytes_written = t[kBytesWritten];
  out.posix_tasks = t[kPosixTasks];
  out.cufile_tasks = t[kCufileTasks];
  out.nvfs_pieces = t[kNvfs];
  out.compat_pieces = t[kCompat];
  out.p2p_pieces = t[kP2p];
  out.shared_windows = t[kSharedWindows];
  out.seconds = static_cast<double>(t[kNanoseconds]) / 1e9;
  for (std::size_t c = 0; c < kReasonCodes; ++c) {
    if (t[kFields + c] != 0) out.reasons[to_string(static_cast<ReasonCode>(c))] = t[kFields + c];
  }
  return out;
}

void reset_stats() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.baseline = sum(r);
}

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
