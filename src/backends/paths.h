// The environments (core/paths.h) made of the real paths: the default one, which the default
// runtime and Runtime() carry, and cuFile's path for an environment of one's own, which a test
// makes on a machine captured under tests/data/platform.
#pragma once

#include <memory>

#include "core/paths.h"
#include "cufile/cufile_machine.h"

namespace ferry::backends {

// The environment of the default runtime, made once: the system's calls, the POSIX path, cuFile
// on this machine and the remote seam.
const core::Environment& default_environment();

// cuFile, reading what it needs of the machine from `machine`.
std::unique_ptr<core::AcceleratedPath> make_cufile_path(cufile::Machine machine);

}  // namespace ferry::backends
