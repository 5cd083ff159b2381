#include "ferry/stats.h"

#include <mutex>
#include <nlohmann/json.hpp>

#include "core/stats_recorder.h"

namespace ferry {
namespace {

std::mutex mu;
Stats totals;

}  // namespace

namespace core {

void record_request(const RouteReport& report, bool failed) {
  std::lock_guard lock(mu);
  ++totals.requests;
  if (failed) ++totals.failed_requests;
  (report.op == Op::kRead ? totals.bytes_read : totals.bytes_written) += report.bytes;
  totals.posix_tasks += report.posix_tasks;
  totals.cufile_tasks += report.cufile_tasks;
  totals.nvfs_pieces += report.cufile.nvfs;
  totals.compat_pieces += report.cufile.posix;
  totals.p2p_pieces += report.cufile.p2p;
  if (report.cufile.shared_window) ++totals.shared_windows;
  totals.seconds += report.seconds;
  for (const RouteReason& r : report.reasons) ++totals.reasons[to_string(r.code)];
}

}  // namespace core

Stats stats() {
  std::lock_guard lock(mu);
  return totals;
}

void reset_stats() {
  std::lock_guard lock(mu);
  totals = Stats{};
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
