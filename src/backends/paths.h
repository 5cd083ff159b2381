// The paths of src/backends for an environment of one's own (core/paths.h): default_environment()
// uses one of each, made once; a test's environment makes its own, e.g. cuFile on a machine
// captured under tests/data/platform.
#pragma once

#include <memory>

#include "core/paths.h"
#include "cufile/cufile_machine.h"

namespace ferry::backends {

// ferry's POSIX path.
std::unique_ptr<core::HostPath> make_posix_path();
// cuFile, reading what it needs of the machine from `machine`.
std::unique_ptr<core::AcceleratedPath> make_cufile_path(cufile::Machine machine);

}  // namespace ferry::backends
