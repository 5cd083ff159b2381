// How much of a file range sits in the page cache, measured without reading it: cachestat(2)
// where the kernel has it (Linux 6.5+), else mincore(2) on a read-only mapping. The cost is
// bounded: cachestat is one system call; mincore checks ranges up to kMincoreExact exactly and
// samples larger ones (the result then says it is an estimate). Thread-safe.
#pragma once

#include <cstdint>
#include <optional>

#include "ferry/page_cache.h"
#include "ferry/route.h"

namespace ferry::io {

// Ranges up to this size are checked page by page with mincore; larger ones are sampled.
constexpr std::uint64_t kMincoreExact = std::uint64_t{64} << 20;

// The residency of [offset, offset + len) of `fd` (ferry::page_cache_residency's work; the
// engine's calls take the sampled kind). Never throws: a failure is reported as unknown with the
// reason.
PageCacheResidency measure_residency(int fd, std::uint64_t offset, std::uint64_t len,
                                     Residency how = Residency::kSampled);

}  // namespace ferry::io
