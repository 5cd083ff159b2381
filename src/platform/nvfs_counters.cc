// ferry::read_nvfs_counters: the nvidia-fs reader's snapshot, copied into the public value.
#include "ferry/nvfs_stats.h"
#include "platform/nvfs_proc.h"

namespace ferry {
namespace {

NvfsRwCounts copy(const platform::NvfsRwCounters& c) { return {c.n, c.ok, c.err, c.mib}; }
platform::NvfsRwCounters copy(const NvfsRwCounts& c) { return {c.n, c.ok, c.err, c.mib}; }

// Back to the reader's form, so that the delta rule lives in one place (platform::delta).
platform::NvfsSnapshot snapshot(const NvfsCounters& c) {
  platform::NvfsSnapshot s;
  s.loaded = c.loaded;
  if (c.stats_read) {
    s.stats.emplace();
    if (c.reads) s.stats->reads = copy(*c.reads);
    if (c.writes) s.stats->writes = copy(*c.writes);
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
  if (s.stats->reads) c.reads = copy(*s.stats->reads);
  if (s.stats->writes) c.writes = copy(*s.stats->writes);
  for (const auto& g : s.stats->gpus)
    c.gpus.push_back({g.bus_id, g.registered_mib, g.cache_mib, g.max_pinned_mib});
  for (const auto& l : s.stats->lines) {
    std::string text = l.plain;
    for (const auto& [k, v] : l.values) text += (text.empty() ? "" : " ") + k + "=" + v;
    c.lines.emplace_back(l.label, text);
  }
  return c;
}

NvfsCountersDelta nvfs_counters_delta(const NvfsCounters& after, const NvfsCounters& before) {
  platform::NvfsDelta d = platform::delta(snapshot(after), snapshot(before));
  return {d.known, d.reason, copy(d.reads), copy(d.writes)};
}

}  // namespace ferry
