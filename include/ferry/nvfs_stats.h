// nvidia-fs's own counters (/proc/driver/nvidia-fs/stats), the system-wide view `ferry stats`
// prints, as gds_stats does for what is observable from outside a process. Other processes add to
// them, and reads and writes are counted only with the module's rw_stats_enabled=1. Per-request
// cuFile counts live in each RouteReport instead. Plain values; the functions are thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ferry {

// n/ok/err/MiB of "Reads" or "Writes"; only printed when rw_stats_enabled=1.
struct NvfsRwCounters {
  std::uint64_t n = 0;
  std::uint64_t ok = 0;
  std::uint64_t err = 0;
  std::uint64_t mib = 0;
};

// One GPU's line of the stats file.
struct NvfsGpuCounters {
  std::string bus_id;  // "0000:3b:00.0"
  std::string uuid;
  std::optional<std::uint64_t> registered_mib;
  std::optional<std::uint64_t> cache_mib;
  std::optional<std::uint64_t> max_pinned_mib;
  std::optional<double> cross_root_port_pct;
};

struct NvfsCounters {
  bool loaded = false;
  std::string reason;  // why not loaded, or what could not be read
  std::optional<std::string> version;
  std::optional<bool> rw_stats_enabled;
  bool stats_read = false;  // the stats file was read
  std::optional<bool> io_stats_enabled;
  std::optional<NvfsRwCounters> reads;  // empty when rw stats are off
  std::optional<NvfsRwCounters> writes;
  std::vector<NvfsGpuCounters> gpus;
  // Every labelled line as printed ("Batches", "n=0 ok=0 err=0 ..."), duplicates kept.
  std::vector<std::pair<std::string, std::string>> lines;
};

// `root` is "/" in production; tests pass captured trees.
NvfsCounters read_nvfs_counters(const std::filesystem::path& root = "/");

// Reads and writes between two readings; unknown (with the reason) when either lacks the
// counters or one went backwards (a reset).
struct NvfsCountersDelta {
  bool known = false;
  std::string reason;
  NvfsRwCounters reads;
  NvfsRwCounters writes;
};
NvfsCountersDelta nvfs_counters_delta(const NvfsCounters& after, const NvfsCounters& before);

}  // namespace ferry
