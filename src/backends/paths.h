// cuFile's path for an environment of one's own (core/paths.h): default_environment() uses one,
// made once; a test's environment makes its own, on a machine captured under
// tests/data/platform.
#pragma once

#include <memory>

#include "core/paths.h"
#include "cufile/cufile_machine.h"

namespace ferry::backends {

// cuFile, reading what it needs of the machine from `machine`.
std::unique_ptr<core::AcceleratedPath> make_cufile_path(cufile::Machine machine);

}  // namespace ferry::backends
