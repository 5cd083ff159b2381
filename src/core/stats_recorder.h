// The engine's side of ferry::stats(): adds a finished request to the process counters.
#pragma once

#include "ferry/route.h"

namespace ferry::core {

void record_request(const RouteReport& report, bool failed);

}  // namespace ferry::core
