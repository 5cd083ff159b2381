// Layer 1: ferry's own choice, per request, between cuFile and its POSIX path, with the reason
// in words. A pure function of the settings, the buffer, the size and the facts below, so
// `ferry explain` and the request engine share it. Thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ferry/memory.h"
#include "ferry/route.h"
#include "ferry/settings.h"

namespace ferry::core {

struct RouteDecision {
  Path path = Path::kPosix;
  std::vector<RouteReason> reasons;
  // Set when the settings forbid the only possible path: the request must fail before I/O.
  std::optional<std::string> refusal;
};

// In auto mode, a range at least this resident in the page cache is read through it: ferry's
// POSIX path copies cached pages at memory speed, where cuFile's accelerated path would read
// the disk (bench/NOTES.md §10).
constexpr double kPageCacheFirst = 0.10;

// What layer 1 may ask, cheapest first. Each callback is called at most once, and only when the
// decision depends on it, so a request that goes to POSIX anyway never opens cuFile's driver.
struct RouteFacts {
  // nullopt when cuFile could serve this file through an accelerated path (nvidia-fs, P2PDMA);
  // else why it could only use its compatibility path. Cheap: no driver open.
  std::function<std::optional<std::string>()> compat_only;
  // Residency of the range in the page cache (unknown counts as cold).
  PageCacheResidency residency;
  // nullopt when cuFile is usable for this file (driver open, handle registered), else why not.
  std::function<std::optional<std::string>()> probe_cufile;
};

RouteDecision decide_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                           const RouteFacts& facts);

// The rule without the speed facts (as if cuFile's accelerated path were possible and the range
// cold): for tests of the availability rules.
RouteDecision decide_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                           const std::optional<std::string>& cufile_unavailable);

// Strict mode at layer 2: under require=gds, a request cuFile served with any non-nvfs piece
// fails, and so does one whose layer 2 cannot be read unless cuFile's compatibility mode was
// refused when its driver opened. Returns the error text, or nullopt when the request stands.
// A window shared with other requests never fails a request after its I/O: the non-nvfs pieces
// may be theirs; *unjudged (report.cufile.unjudged) then says so.
std::optional<std::string> refuse_layer2(const Settings& settings, const RouteReport& report,
                                         bool compat_refused_at_open, std::string* unjudged);

}  // namespace ferry::core
