// ferry's own POSIX path. Host memory: pread/pwrite straight into the caller's buffer. GPU
// memory: pread into pinned bounce buffers, each chunk's copy to the GPU queued on a
// non-blocking stream while the next chunk is read (kPipelineDepth chunks per worker). Direct
// I/O: O_DIRECT through page-aligned bounce buffers, unaligned head and tail handled. Thread-safe;
// each Worker belongs to one thread.
#pragma once

#include "core/backend.h"

namespace ferry::posix {

class PosixBackend final : public core::Backend {
 public:
  std::unique_ptr<core::Worker> make_worker(const core::RequestContext& context) override;
  std::string describe(const core::RequestContext& context) const override;
  std::size_t max_workers(const core::RequestContext& context) const override;
};

}  // namespace ferry::posix
