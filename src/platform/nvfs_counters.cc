// ferry::read_nvfs_counters: the nvidia-fs reader's snapshot, as the public value.
#include "ferry/nvfs_stats.h"
#include "platform/nvfs_proc.h"

namespace ferry {
namespace {

// Back to the reader's form, so that the delta rule lives in one place (platform::delta).
platform::NvfsSnapshot snapshot(const NvfsCounters& c) {
  platform::NvfsSnapshot s;
  s.loaded = c.loaded;
  if (c.stats_read) {
    s.stats.emplace();
    s.stats->reads = c.reads;
    s.stats->writes = c.writes;
  }
  return s;
}

}  // namespace

NvfsCounters read_nvfs_counters(const std::filesystem::path& root) {
  platform::NvfsSnapshot s = platform::read_nvfs(root);
  NvfsCounters c;
  c.loaded = s.loaded;
  c.reason = s.reason;
  for (const auto& p : s.problems) c.reason += (c.reason.empty() ? "" : "; ") + p;
  c.version = s.version;
  c.rw_stats_enabled = s.rw_stats_enabled;
  if (!s.stats) return c;
  c.stats_read = true;
  c.io_stats_enabled = s.stats->io_stats_enabled;
  c.reads = s.stats->reads;
  c.writes = s.stats->writes;
  c.gpus = s.stats->gpus;
  for (const auto& l : s.stats->lines) {
    std::string text = l.plain;
    for (const auto& [k, v] : l.values) text += (text.empty() ? "" : " ") + k + "=" + v;
    c.lines.emplace_back(l.label, text);
  }
  return c;
}

NvfsCountersDelta nvfs_counters_delta(const NvfsCounters& after, const NvfsCounters& before) {
  return platform::delta(snapshot(after), snapshot(before));
}

}  // namespace ferry
