// Layer 1: ferry's own choice, per request, between cuFile and its POSIX path, with the reason
// in words. Pure function of the settings, the buffer, the size and cuFile's availability, so
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

// `cufile_unavailable` is nullopt when cuFile is usable for this file, else why it is not.
RouteDecision decide_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                           const std::optional<std::string>& cufile_unavailable);

// The same, asking `probe_cufile` only when the decision depends on it, so a request that
// cannot go to cuFile anyway (compat on, host buffer, below the threshold) never opens cuFile.
RouteDecision decide_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                           const std::function<std::optional<std::string>()>& probe_cufile);

// Strict mode at layer 2: under require=gds, a request cuFile served with any non-nvfs piece
// fails, and so does one whose layer 2 cannot be read unless cuFile's compatibility mode was
// refused when its driver opened. Returns the error text, or nullopt when the request stands.
std::optional<std::string> refuse_layer2(const Settings& settings, const RouteReport& report,
                                         bool compat_refused_at_open);

}  // namespace ferry::core
