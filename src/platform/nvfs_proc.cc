#include "platform/nvfs_proc.h"

#include <fmt/format.h>

#include "platform/text_file.h"

namespace ferry::platform {
namespace {

// "NVFS Driver(version: 2.28.4)" -> "2.28.4" for prefix "NVFS Driver(version:".
std::optional<std::string> paren_value(std::string_view line, std::string_view prefix) {
  if (line.substr(0, prefix.size()) != prefix) return std::nullopt;
  auto rest = line.substr(prefix.size());
  auto close = rest.find(')');
  return std::string(trim(rest.substr(0, close)));
}

std::optional<bool> enabled_word(std::string_view w) {
  w = trim(w);
  if (w == "Enabled" || w == "enabled" || w == "True" || w == "1") return true;
  if (w == "Disabled" || w == "disabled" || w == "False" || w == "0") return false;
  return std::nullopt;
}

std::optional<std::uint64_t> get_u64(const NvfsStatsLine& l, std::string_view key) {
  auto it = l.values.find(std::string(key));
  if (it == l.values.end()) return std::nullopt;
  return parse_u64(it->second);
}

std::optional<NvfsRwCounters> rw_counters(const NvfsStatsLine& l, std::string_view mib_key) {
  auto n = get_u64(l, "n"), ok = get_u64(l, "ok"), err = get_u64(l, "err");
  auto mib = get_u64(l, mib_key);
  if (!n || !ok || !err) return std::nullopt;
  return NvfsRwCounters{*n, *ok, *err, mib.value_or(0)};
}

// Splits a labelled line: the label ends at the last ':' before the first '=' (labels such as
// "GPU 0000:3b:00.0 uuid:..." contain colons themselves); without '=', at the first ':'.
std::optional<NvfsStatsLine> split_labelled(std::string_view line) {
  auto eq = line.find('=');
  auto colon = eq == std::string_view::npos ? line.find(':') : line.rfind(':', eq);
  if (colon == std::string_view::npos) return std::nullopt;
  NvfsStatsLine out;
  out.label = std::string(trim(line.substr(0, colon)));
  auto rest = line.substr(colon + 1);
  if (eq == std::string_view::npos) {
    out.plain = std::string(trim(rest));
    return out;
  }
  for (auto tok : split_whitespace(rest)) {
    auto e = tok.find('=');
    if (e == std::string_view::npos) continue;
    out.values.emplace(std::string(tok.substr(0, e)), std::string(tok.substr(e + 1)));
  }
  return out;
}

void parse_gpu_line(const NvfsStatsLine& l, NvfsStats& s) {
  NvfsGpuCounters g;
  auto words = split_whitespace(l.label);  // "GPU", "0000:3b:00.0", "uuid:..."
  if (words.size() >= 2) g.bus_id = std::string(words[1]);
  for (auto w : words)
    if (w.substr(0, 5) == "uuid:") g.uuid = std::string(w.substr(5));
  g.registered_mib = get_u64(l, "Registered_MiB");
  g.cache_mib = get_u64(l, "Cache_MiB");
  g.max_pinned_mib = get_u64(l, "max_pinned_MiB");
  if (auto it = l.values.find("cross_root_port(%)"); it != l.values.end())
    g.cross_root_port_pct = parse_double(it->second);
  s.gpus.push_back(std::move(g));
}

}  // namespace

NvfsStats parse_nvfs_stats(std::string_view text) {
  NvfsStats s;
  for (auto raw : split_lines(text)) {
    auto line = trim(raw);
    if (line.empty()) continue;
    if (auto v = paren_value(line, "NVFS statistics(ver:")) {
      s.stats_version = v;
      continue;
    }
    if (auto v = paren_value(line, "NVFS Driver(version:")) {
      s.driver_version = v;
      continue;
    }
    if (line.substr(0, 9) == "IO stats:") {
      // "IO stats: Enabled, peer IO stats: Disabled"
      auto comma = line.find(',');
      s.io_stats_enabled = enabled_word(
          line.substr(9, comma == std::string_view::npos ? std::string_view::npos : comma - 9));
      auto peer = line.find("peer IO stats:");
      if (peer != std::string_view::npos)
        s.peer_io_stats_enabled = enabled_word(line.substr(peer + 14));
      continue;
    }
    auto l = split_labelled(line);
    if (!l) continue;
    if (l->label.substr(0, 4) == "GPU ") parse_gpu_line(*l, s);
    if (l->label == "Reads") {
      if (!s.reads) s.reads = rw_counters(*l, "readMiB");
      if (!s.read_err) s.read_err = get_u64(*l, "err");
    }
    if (l->label == "Writes") {
      if (!s.writes) s.writes = rw_counters(*l, "writeMiB");
      if (!s.write_err) s.write_err = get_u64(*l, "err");
    }
    s.lines.push_back(std::move(*l));
  }
  return s;
}

std::optional<std::string> parse_nvfs_version(std::string_view text) {
  auto line = trim(text.substr(0, text.find('\n')));
  auto colon = line.find(':');
  auto v = trim(colon == std::string_view::npos ? line : line.substr(colon + 1));
  if (v.empty()) return std::nullopt;
  return std::string(v);
}

std::map<std::string, std::string> parse_nvfs_modules(std::string_view text) {
  std::map<std::string, std::string> out;
  for (auto raw : split_lines(text)) {
    auto line = trim(raw);
    if (line.empty()) continue;
    auto colon = line.find(':');
    auto name = trim(line.substr(0, colon));
    auto version =
        colon == std::string_view::npos ? std::string_view{} : trim(line.substr(colon + 1));
    if (!name.empty()) out.emplace(std::string(name), std::string(version));
  }
  return out;
}

std::vector<std::string> parse_nvfs_bridges(std::string_view text) {
  std::vector<std::string> out;
  for (auto tok : split_whitespace(text)) out.emplace_back(tok);
  return out;
}

NvfsSnapshot read_nvfs(const std::filesystem::path& root) {
  NvfsSnapshot s;
  auto dir = under_root(root, "/proc/driver/nvidia-fs");
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    s.reason = "/proc/driver/nvidia-fs does not exist: the nvidia-fs kernel module is not loaded";
    return s;
  }
  s.loaded = true;
  auto read = [&](std::string_view name) -> std::optional<std::string> {
    auto f = read_text_file(dir / name);
    if (!f.ok) {
      s.problems.push_back(f.error);
      return std::nullopt;
    }
    return std::move(f.text);
  };
  if (auto t = read("version")) s.version = parse_nvfs_version(*t);
  if (auto t = read("devcount")) s.devcount = parse_u64(*t);
  if (auto t = read("modules")) s.modules = parse_nvfs_modules(*t);
  if (auto t = read("bridges")) s.acs_bridges = parse_nvfs_bridges(*t);
  if (auto t = read("stats")) s.stats = parse_nvfs_stats(*t);
  auto param =
      read_text_file(under_root(root, "/sys/module/nvidia_fs/parameters/rw_stats_enabled"));
  if (param.ok) {
    if (auto v = parse_u64(param.text)) s.rw_stats_enabled = *v != 0;
  } else {
    s.problems.push_back(param.error);
  }
  if (!s.problems.empty())
    s.reason =
        fmt::format("nvidia-fs is loaded; {} of its files could not be read", s.problems.size());
  return s;
}

NvfsCountersDelta delta(const NvfsSnapshot& after, const NvfsSnapshot& before) {
  NvfsCountersDelta d;
  for (const auto* s : {&before, &after}) {
    if (!s->loaded) {
      d.reason = "nvidia-fs is not loaded: no counters";
      return d;
    }
    if (!s->stats) {
      d.reason = "/proc/driver/nvidia-fs/stats could not be read";
      return d;
    }
    if (!s->stats->reads || !s->stats->writes) {
      d.reason =
          "rw_stats_enabled=0: nvidia-fs does not count reads and writes (set "
          "/sys/module/nvidia_fs/parameters/rw_stats_enabled to 1)";
      return d;
    }
  }
  auto sub = [&](const NvfsRwCounters& a, const NvfsRwCounters& b, NvfsRwCounters& out) {
    if (a.n < b.n || a.ok < b.ok || a.err < b.err || a.mib < b.mib) return false;
    out = NvfsRwCounters{a.n - b.n, a.ok - b.ok, a.err - b.err, a.mib - b.mib};
    return true;
  };
  if (!sub(*after.stats->reads, *before.stats->reads, d.reads) ||
      !sub(*after.stats->writes, *before.stats->writes, d.writes)) {
    d.reason = "a counter went backwards: the stats were reset between the two snapshots";
    return d;
  }
  d.known = true;
  d.reason = "system-wide nvidia-fs counters: other processes add to them";
  return d;
}

}  // namespace ferry::platform
