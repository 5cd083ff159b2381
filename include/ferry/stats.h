// Process-wide counters of every request ferry served, with the same fields as the route
// report. Updated when each request completes; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

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

Stats stats();
void reset_stats();

}  // namespace ferry
