#include "ferry/stats.h"

#include <mutex>
#include <nlohmann/json.hpp>

#include "core/stats_recorder.h"

namespace ferry {
namespace {

// Leaked on purpose: a request finishing on a pool thread during exit still records itself.
struct State {
  std::mutex mu;
  Stats totals;
};
State& state() {
  static State* s = new State;
  return *s;
}

}  // namespace

namespace core {

void record_request(const RouteReport& report, bool failed) {
  State& st = state();
  std::lock_guard lock(st.mu);
  ++st.totals.requests;
  if (failed) ++st.totals.failed_requests;
  (report.op == Op::kRead ? st.totals.bytes_read : st.totals.bytes_written) += report.bytes;
  st.totals.posix_tasks += report.posix_tasks;
  st.totals.cufile_tasks += report.cufile_tasks;
  st.totals.nvfs_pieces += report.cufile.nvfs;
  st.totals.compat_pieces += report.cufile.posix;
  st.totals.p2p_pieces += report.cufile.p2p;
  if (report.cufile.shared_window) ++st.totals.shared_windows;
  st.totals.seconds += report.seconds;
  for (const RouteReason& r : report.reasons) ++st.totals.reasons[to_string(r.code)];
}

}  // namespace core

Stats stats() {
  State& st = state();
  std::lock_guard lock(st.mu);
  return st.totals;
}

void reset_stats() {
  State& st = state();
  std::lock_guard lock(st.mu);
  st.totals = Stats{};
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
