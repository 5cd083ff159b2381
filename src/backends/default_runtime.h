// What a program gets without naming a runtime: the default runtime, on the default environment
// (backends/paths.h). They live here, above core, because only this room can compose that
// environment; core is handed a runtime (OpenFile's constructor) and never names them. Here too
// are the public definitions that use them: File(path, mode, options), Runtime(),
// free_idle_staging() and warm_up(). Thread-safe.
#pragma once

#include "core/runtime_state.h"
#include "ferry/file.h"

namespace ferry::backends {

// The runtime of Files opened without FileOptions::runtime: made once, never destroyed.
core::RuntimeState& default_runtime();

// The runtime a File opened with `options` runs on: FileOptions::runtime's, else the default.
core::RuntimeState& runtime_of(const FileOptions& options);

}  // namespace ferry::backends
