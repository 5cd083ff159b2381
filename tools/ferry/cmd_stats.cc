// ferry stats: nvidia-fs's system-wide counters (the gds_stats view of what is observable from
// outside a process) and, with --watch, their growth over an interval. A fresh CLI process has
// served no request, so ferry's own per-process counters are not shown: each request's cuFile
// counts are in its route report (`ferry read --json`: route.layer2).
#include <ferry/nvfs_stats.h>
#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "common.h"

namespace ferry::cli {
namespace {

constexpr const char* kPerRequest =
    "per-request cuFile counts (nvfs, posix, p2p pieces) are in each route report: "
    "ferry read --json, route.layer2";

struct StatsArgs {
  std::string root = "/";
  double watch = 0;
  bool json = false;
};

nlohmann::json rw_json(const std::optional<NvfsRwCounts>& c) {
  if (!c) return nullptr;
  return {{"n", c->n}, {"ok", c->ok}, {"err", c->err}, {"mib", c->mib}};
}

nlohmann::json counters_json(const NvfsCounters& c) {
  nlohmann::json gpus = nlohmann::json::array();
  auto opt = [](const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  for (const auto& g : c.gpus)
    gpus.push_back({{"bus_id", g.bus_id},
                    {"registered_mib", opt(g.registered_mib)},
                    {"cache_mib", opt(g.cache_mib)},
                    {"max_pinned_mib", opt(g.max_pinned_mib)}});
  nlohmann::json lines = nlohmann::json::array();
  for (const auto& [label, text] : c.lines) lines.push_back({{"label", label}, {"text", text}});
  return {{"loaded", c.loaded},
          {"reason", c.reason},
          {"version", opt(c.version)},
          {"rw_stats_enabled", opt(c.rw_stats_enabled)},
          {"stats_read", c.stats_read},
          {"io_stats_enabled", opt(c.io_stats_enabled)},
          {"reads", rw_json(c.reads)},
          {"writes", rw_json(c.writes)},
          {"gpus", gpus},
          {"lines", lines}};
}

std::string rw_text(const NvfsRwCounts& c) {
  return fmt::format("n={} ok={} err={} MiB={}", c.n, c.ok, c.err, c.mib);
}

void print_counters(const NvfsCounters& c) {
  if (!c.loaded) {
    fmt::print("nvidia-fs not loaded: {}\n", c.reason);
    return;
  }
  fmt::print("nvidia-fs {} (system-wide counters: every process adds to them)\n",
             c.version.value_or("version unknown"));
  if (!c.stats_read) {
    fmt::print("  stats unreadable: {}\n", c.reason);
    return;
  }
  if (c.reads && c.writes) {
    fmt::print("  reads   {}\n  writes  {}\n", rw_text(*c.reads), rw_text(*c.writes));
  } else {
    fmt::print(
        "  reads and writes not counted: rw_stats_enabled is {} (set "
        "/sys/module/nvidia_fs/parameters/rw_stats_enabled to 1)\n",
        c.rw_stats_enabled ? (*c.rw_stats_enabled ? "1" : "0") : "unknown");
  }
  for (const auto& g : c.gpus) {
    auto mib = [](const std::optional<std::uint64_t>& v) {
      return v ? std::to_string(*v) : std::string("?");
    };
    fmt::print("  gpu {}  registered {} MiB, cache {} MiB, max pinned {} MiB\n", g.bus_id,
               mib(g.registered_mib), mib(g.cache_mib), mib(g.max_pinned_mib));
  }
}

int run(const StatsArgs& a) {
  const NvfsCounters before = read_nvfs_counters(a.root);
  if (a.watch <= 0) {
    if (a.json) {
      nlohmann::json out = {{"nvidia_fs", counters_json(before)}, {"per_request", kPerRequest}};
      fmt::print("{}\n", out.dump(2));
    } else {
      print_counters(before);
      fmt::print("note: {}\n", kPerRequest);
    }
    return 0;
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(a.watch));
  const NvfsCounters after = read_nvfs_counters(a.root);
  const NvfsCountersDelta d = nvfs_counters_delta(after, before);
  if (a.json) {
    nlohmann::json out = {{"nvidia_fs", counters_json(after)},
                          {"watch",
                           {{"seconds", a.watch},
                            {"known", d.known},
                            {"reason", d.reason},
                            {"reads", d.known ? rw_json(d.reads) : nullptr},
                            {"writes", d.known ? rw_json(d.writes) : nullptr}}},
                          {"per_request", kPerRequest}};
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  print_counters(after);
  if (!d.known) {
    fmt::print("over {} s: unknown: {}\n", a.watch, d.reason);
  } else {
    fmt::print("over {} s: reads {} ({:.1f} MiB/s), writes {} ({:.1f} MiB/s)\n", a.watch,
               rw_text(d.reads), d.reads.mib / a.watch, rw_text(d.writes), d.writes.mib / a.watch);
  }
  fmt::print("note: {}\n", kPerRequest);
  return 0;
}

}  // namespace

void add_stats_command(CLI::App& app, std::function<int()>& action) {
  auto args = std::make_shared<StatsArgs>();
  CLI::App* cmd = app.add_subcommand(
      "stats", "Print nvidia-fs's system-wide counters (gds_stats), or their growth with --watch");
  cmd->add_option("--watch", args->watch, "Print the counters' growth over this many seconds")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--root", args->root, "Read /proc and /sys under this directory instead of /");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &action] { action = [args] { return run(*args); }; });
}

}  // namespace ferry::cli
