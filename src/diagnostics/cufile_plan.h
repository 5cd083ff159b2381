// Bridges cufile.json (CufileConfig, read by src/platform) to the scheduling values ferry::plan
// needs. The splitting rule itself (predict_cufile_pieces) is public in ferry/plan.h and is
// implemented here, beside ferry::plan: one room implements ferry/plan.h. Pure; thread-safe.
#pragma once

#include "ferry/plan.h"
#include "platform/cufile_config.h"

namespace ferry::diagnostics {

// The three values cuFile's splitting depends on, with the reason any of them is unknown.
CufileScheduling scheduling_from_config(const platform::CufileConfig& config);

}  // namespace ferry::diagnostics
