// Bridges cufile.json (CufileConfig) to the scheduling values ferry::plan needs. The splitting
// rule itself (predict_cufile_pieces) is public in ferry/plan.h. Pure; thread-safe.
#pragma once

#include "ferry/plan.h"
#include "platform/cufile_config.h"

namespace ferry::platform {

// The three values cuFile's splitting depends on, with the reason any of them is unknown.
CufileScheduling scheduling_from_config(const CufileConfig& config);

}  // namespace ferry::platform
