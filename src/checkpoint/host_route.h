// The host routes of Checkpoint::load (ferry::HostRoute): whether a shard's bytes bound for
// pageable host memory are mapped (its tensors views of a private mapping, as safetensors' are),
// mapped and populated (read in by parallel faults before the load returns) or read by ferry's
// parallel read, decided from host_load and the page cache. Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ferry/checkpoint.h"

namespace ferry::checkpoint {

// Under host_load=auto, a shard at least this resident in the page cache is mapped and left to
// fault in on first touch, as safetensors' files are; a colder one is mapped and populated
// (bench/NOTES.md §31).
constexpr double kMapResident = 0.9;

// The route of `mode` for bytes of a shard: remote or local, opened with O_DIRECT or not, and
// how much of them is resident (measured only when it can matter). Pure: no I/O.
HostRoute decide_host_route(HostLoad mode, bool remote, bool direct,
                            const PageCacheResidency& residency);

struct MappedShard {
  HostRoute route;
  std::shared_ptr<const FileMapping> mapping;  // null when the route is "read"
};
// The route of bytes [begin, end) of shard `name` at `path` (a file or a remote URL), which
// was `size` bytes when its header was read; mapped, the mapping covers them from the page
// boundary at or below `begin`. Throws CheckpointError when the file changed size, IoError when
// it does not open or map.
MappedShard route_shard(HostLoad mode, bool direct, const std::string& name,
                        const std::filesystem::path& path, std::uint64_t size, std::uint64_t begin,
                        std::uint64_t end);

// Reads every page of `mappings` into the page cache and maps it, from `nthreads` threads that
// take `chunk` bytes at a time: MADV_WILLNEED (one large read-ahead, whatever the disk's
// read_ahead_kb), then MADV_POPULATE_READ (the faults), then a read of each page (its first
// access, which a VM may charge apart). Calls `progress(bytes done)`
// from this thread about every 10 ms. Throws IoError naming the file, offset and length of the
// first failure (a file cut short: EFAULT), once every thread has stopped; an exception from
// `progress` stops the threads too.
void populate(const std::vector<const FileMapping*>& mappings, std::size_t nthreads,
              std::size_t chunk, const std::function<void(std::uint64_t)>& progress);

// Whether a tensor can be a view of a page-aligned mapping of its file in every framework: its
// offset is a multiple of its dtype's size (1 for the packed kinds, which come back as bytes).
bool viewable_in_place(const TensorInfo& t);

}  // namespace ferry::checkpoint
