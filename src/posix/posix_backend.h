// ferry's own POSIX path. Host memory: pread/pwrite straight into the caller's buffer. GPU
// memory: pread into pinned staging buffers, each chunk's copy to the GPU queued on the worker's
// stream (ordered after the legacy default stream) while the next chunk is read (kPipelineDepth
// chunks per worker). Direct I/O: O_DIRECT through page-aligned staging buffers, unaligned head and
// tail handled. Cold reads: a read task of a buffered File whose pages are not in the page cache
// reads with O_DIRECT. Thread-safe; each Worker belongs to one thread.
#pragma once

#include "core/backend.h"
#include "core/paths.h"

namespace ferry::posix {

// A read task of at least kColdTaskMin bytes with less than kColdTaskResident of its pages in the
// page cache reads with O_DIRECT: on the GPU machine's disk that was 1.27x the rate of buffered
// reads at 1/26 of the CPU time, and buffered reads only win once about a fifth of the task is
// cached (bench/NOTES.md §9). Smaller tasks stay buffered, where readahead helps.
constexpr std::size_t kColdTaskMin = std::size_t{1} << 20;
constexpr double kColdTaskResident = 0.20;

// Whether a read task [offset, offset + size) of a buffered File reads with O_DIRECT by the rule
// above, given the residency of the whole request's range (measured once per request): a
// request that is all cached never checks its tasks, one that is all cold need not.
bool reads_cold(const core::HostPath& host, const PageCacheResidency& whole, int fd,
                std::uint64_t offset, std::size_t size);

// A buffered write of at least kPreallocateMin bytes beyond the end of a file on ext4 first
// allocates those blocks with fallocate(FALLOC_FL_KEEP_SIZE): ext4's buffered writes into
// allocated blocks skip delayed allocation's work for each block: a pwrite loop into the page
// cache ran at 1.16x the speed and 0.86x the CPU time (bench/NOTES.md §4). The size grows only as
// the bytes are written, so a write that fails leaves the file at the size of what it wrote (the
// blocks allocated beyond stay the file's until it is truncated). Returns what was done, in
// words, for the route report; empty where nothing was tried.
constexpr std::uint64_t kPreallocateMin = std::uint64_t{8} << 20;
std::string preallocate_for_write(core::OpenFile& file, std::uint64_t offset, std::uint64_t size);

class PosixBackend final : public core::Backend {
 public:
  std::unique_ptr<core::Worker> make_worker(const core::RequestContext& context) override;
  std::string describe(const core::RequestContext& context) const override;
  // The same words from the facts they depend on (no File needed).
  std::string describe(Op op, const MemoryInfo& memory, const Settings& settings, bool direct,
                       std::size_t workers) const;
  std::size_t max_workers(const core::RequestContext& context) const override;
  // Runs one task in the calling thread, with a worker on its stack (small requests).
  std::size_t run_inline(const core::RequestContext& context, const core::Task& task) const;
};

}  // namespace ferry::posix
