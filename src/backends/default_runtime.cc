#include "backends/default_runtime.h"

#include <memory>
#include <utility>

#include "backends/paths.h"
#include "core/open_file.h"
#include "cuda/stream_order.h"
#include "ferry/runtime.h"
#include "io/io_seam.h"

namespace ferry {
namespace backends {

core::RuntimeState& default_runtime() {
  // Process-wide: the runtime of every File opened without FileOptions::runtime. Leaked on
  // purpose: requests still in flight at exit keep running threads that a static
  // destructor must not join under them.
  static core::RuntimeState* rt = new core::RuntimeState(default_environment());
  return *rt;
}

core::RuntimeState& runtime_of(const FileOptions& options) {
  return options.runtime != nullptr ? core::state_of(*options.runtime) : default_runtime();
}

}  // namespace backends

File::File(const std::filesystem::path& path, std::string_view mode, FileOptions options) {
  const io::CancelScope cancel(options.cancel);
  core::RuntimeState& runtime = backends::runtime_of(options);
  file_ = std::make_shared<core::OpenFile>(path, mode, std::move(options), runtime);
}

Runtime::Runtime()
    : state_(std::make_unique<core::RuntimeState>(backends::default_environment())) {}

std::size_t free_idle_staging() {
  // Stream-ordered GPU requests stage through a process-wide cache of their own.
  return backends::default_runtime().staging().free_idle() + cuda::free_idle_staged_copies();
}

}  // namespace ferry
