// ferry::page_cache_residency: how much of a file range sits in the page cache, measured without
// reading it. The one measurement of ferry: the engine's cold-read rule, `ferry bench`'s cache
// states and ferry.kvikio's get_page_cache_info all ask it. cachestat(2) where the kernel has it
// (Linux 6.5+), else mincore(2) over a read-only mapping. Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ferry/route.h"

namespace ferry {

// How closely: kSampled bounds the cost (mincore samples ranges over 64 MiB, and the result says
// it is an estimate), kExact looks at every page (mincore a window at a time).
enum class Residency { kSampled, kExact };

// The residency of [offset, offset + length) of the open descriptor `fd`; `length` nullopt: to
// the end of the file. Never throws: what cannot be measured comes back unknown, with why_not.
PageCacheResidency page_cache_residency(int fd, std::uint64_t offset = 0,
                                        std::optional<std::uint64_t> length = std::nullopt,
                                        Residency how = Residency::kSampled);
// The same for the file at `path`, opened read-only for the measurement. Throws IoError naming
// the path when it does not open.
PageCacheResidency page_cache_residency(const std::string& path, std::uint64_t offset = 0,
                                        std::optional<std::uint64_t> length = std::nullopt,
                                        Residency how = Residency::kSampled);

}  // namespace ferry
