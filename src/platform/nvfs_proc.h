// What the nvidia-fs kernel module shows under /proc/driver/nvidia-fs/ and
// /sys/module/nvidia_fs/parameters/: version, device count, registered storage drivers,
// ACS-enabled bridges and the stats counters, parsed by key=value tokens (never by column), per
// docs/platform.md. Pure parsers plus a reader that takes a root directory. Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/nvfs_stats.h"

namespace ferry::platform {

// One "Label : k=v k=v" line of the stats file.
struct NvfsStatsLine {
  std::string label;
  std::map<std::string, std::string> values;  // key=value tokens
  std::string plain;                          // the text after ':' when it has no '=' tokens
};

struct NvfsStats {
  std::optional<std::string> stats_version;   // "NVFS statistics(ver: 4.0)"
  std::optional<std::string> driver_version;  // "NVFS Driver(version: 2.28.4)"
  std::optional<bool> io_stats_enabled;       // "IO stats: Enabled|Disabled"
  std::optional<bool> peer_io_stats_enabled;
  std::optional<NvfsRwCounters> reads;    // empty when rw stats are off
  std::optional<NvfsRwCounters> writes;   // idem
  std::optional<std::uint64_t> read_err;  // printed either way
  std::optional<std::uint64_t> write_err;
  std::vector<NvfsGpuCounters> gpus;
  std::vector<NvfsStatsLine> lines;  // every labelled line, in order (duplicates kept)
};

NvfsStats parse_nvfs_stats(std::string_view text);
std::optional<std::string> parse_nvfs_version(std::string_view text);  // "version: 2.28"
// "nvme: 2.28" lines -> name -> version (version may be empty).
std::map<std::string, std::string> parse_nvfs_modules(std::string_view text);
std::vector<std::string> parse_nvfs_bridges(std::string_view text);

struct NvfsSnapshot {
  bool loaded = false;  // /proc/driver/nvidia-fs exists
  std::string reason;   // why not loaded, or what could not be read
  std::optional<std::string> version;
  std::optional<std::uint64_t> devcount;
  std::optional<std::map<std::string, std::string>> modules;
  std::optional<std::vector<std::string>> acs_bridges;
  std::optional<bool> rw_stats_enabled;  // the module parameter
  std::optional<NvfsStats> stats;
  std::vector<std::string> problems;  // files present but unreadable
};

NvfsSnapshot read_nvfs(const std::filesystem::path& root);

// Reads and writes between two snapshots. Unknown (with a reason) when either side lacks the
// counters (module absent, rw stats off) or a counter went backwards (stats reset).
NvfsCountersDelta delta(const NvfsSnapshot& after, const NvfsSnapshot& before);

}  // namespace ferry::platform
