// Layer 1: ferry's own choice, per request, between cuFile and its POSIX path, with the reason
// in words. Pure function of the settings, the buffer, the size and cuFile's availability, so
// `ferry explain` and the request engine share it. Thread-safe.
#pragma once

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

}  // namespace ferry::core
