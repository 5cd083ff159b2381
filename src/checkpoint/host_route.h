// The host routes of Checkpoint::load (ferry::HostRoute): whether a shard's bytes bound for
// pageable host memory are mapped (its tensors views of a private mapping, as safetensors' are)
// or read by ferry's parallel read, decided from host_load and the page cache. Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "ferry/checkpoint.h"

namespace ferry::checkpoint {

// Under host_load=auto, a shard is mapped when at least this fraction of its chosen bytes is in
// the page cache: the few cold pages then fault in from the disk on first touch, as safetensors'
// do, where reading would copy every resident byte (bench/NOTES.md §31).
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

// Whether a tensor can be a view of a page-aligned mapping of its file in every framework: its
// offset is a multiple of its dtype's size (1 for the packed kinds, which come back as bytes).
bool viewable_in_place(const TensorInfo& t);

}  // namespace ferry::checkpoint
