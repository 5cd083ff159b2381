// ferry stats: with -p PID, a running process's own counters at both layers, read from the
// segment it publishes (docs/stats.md), and their rates; with --all, every process on the machine
// that publishes one; with --prometheus, the same as OpenMetrics text. Without any of these,
// nvidia-fs's system-wide counters (the gds_stats view of what the kernel module counts) and,
// with --watch, their growth over an interval.
#include <ferry/nvfs_stats.h>
#include <ferry/sizes.h>
#include <ferry/stats.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "common.h"

namespace ferry::cli {
namespace {

constexpr const char* kPerRequest =
    "per-process counters at both layers: ferry stats --all, ferry stats -p PID; "
    "per-request cuFile counts (nvfs, posix, p2p pieces) are in each route report: "
    "ferry read --json, route.layer2";

// Linux's largest pid_max (PID_MAX_LIMIT on 64-bit kernels).
constexpr long long kMaxPid = 4194304;
// A day: a longer interval is a typo, and sleeping that long would look like a hang.
constexpr double kMaxWatchSeconds = 86400;

struct StatsArgs {
  std::string root = "/";
  double watch = 0;
  bool json = false;
  int pid = 0;
  bool all = false;
  bool prometheus = false;
  std::string dir;
  int repeat = 1;
};

nlohmann::json rw_json(const std::optional<NvfsRwCounters>& c) {
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

std::string rw_text(const NvfsRwCounters& c) {
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

int run_system_wide(const StatsArgs& a) {
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
    // nvidia-fs counts MiB; rates are said in GB/s, as everywhere in ferry.
    fmt::print("over {} s: reads {} ({}), writes {} ({})\n", a.watch, rw_text(d.reads),
               format_rate(d.reads.mib * 1048576.0 / a.watch), rw_text(d.writes),
               format_rate(d.writes.mib * 1048576.0 / a.watch));
  }
  fmt::print("note: {}\n", kPerRequest);
  return 0;
}

// --- One process ------------------------------------------------------------------------------

// Growth from `before` to `after` per second; `before` null: since the process began counting.
nlohmann::json rates_json(const ProcessStats& after, const ProcessStats* before) {
  const double from = before != nullptr ? before->read_at : after.counting_since;
  const double seconds = after.read_at - from;
  const ProcessStats zero;
  const ProcessStats& b = before != nullptr ? *before : zero;
  auto rate = [seconds](std::uint64_t later, std::uint64_t earlier) {
    // Counters only grow; a process seen twice is the same one, so later >= earlier.
    const double d = later >= earlier ? static_cast<double>(later - earlier) : 0.0;
    return seconds > 0 ? d / seconds : 0.0;
  };
  const Stats& t = after.totals;
  const Stats& u = b.totals;
  return {
      {"seconds", seconds},
      {"from", before != nullptr ? "watch" : "counting_since"},
      {"requests_per_s", rate(t.requests, u.requests)},
      {"failed_per_s", rate(t.failed_requests, u.failed_requests)},
      {"bytes_read_per_s", rate(t.bytes_read, u.bytes_read)},
      {"bytes_written_per_s", rate(t.bytes_written, u.bytes_written)},
      {"posix_requests_per_s", rate(after.posix.counts.requests(), b.posix.counts.requests())},
      {"cufile_requests_per_s", rate(after.cufile.counts.requests(), b.cufile.counts.requests())},
      {"posix_tasks_per_s", rate(t.posix_tasks, u.posix_tasks)},
      {"cufile_tasks_per_s", rate(t.cufile_tasks, u.cufile_tasks)},
      {"nvfs_pieces_per_s", rate(t.nvfs_pieces, u.nvfs_pieces)},
      {"compat_pieces_per_s", rate(t.compat_pieces, u.compat_pieces)},
      {"p2p_pieces_per_s", rate(t.p2p_pieces, u.p2p_pieces)}};
}

std::string rates_text(const nlohmann::json& r) {
  const std::string over =
      r["from"] == "watch"
          ? fmt::format("over {:.3g} s", r["seconds"].get<double>())
          : fmt::format("since counting began ({:.3g} s)", r["seconds"].get<double>());
  return fmt::format(
      "  rates {}: {:.1f} request(s)/s ({:.1f} posix, {:.1f} cufile, {:.1f} failed), read {}, "
      "written {}; layer 2: nvfs {:.1f}/s, posix {:.1f}/s, p2p {:.1f}/s\n",
      over, r["requests_per_s"].get<double>(), r["posix_requests_per_s"].get<double>(),
      r["cufile_requests_per_s"].get<double>(), r["failed_per_s"].get<double>(),
      format_rate(r["bytes_read_per_s"].get<double>()),
      format_rate(r["bytes_written_per_s"].get<double>()), r["nvfs_pieces_per_s"].get<double>(),
      r["compat_pieces_per_s"].get<double>(), r["p2p_pieces_per_s"].get<double>());
}

void print_process(const StatsArgs& a, const ProcessStats& p, const ProcessStats* before) {
  const nlohmann::json rates = rates_json(p, before);
  if (a.json) {
    nlohmann::json out = {{"process", nlohmann::json::parse(p.to_json())}, {"rates", rates}};
    fmt::print("{}\n", a.repeat == 1 ? json_text(out, 2) : json_text(out));
  } else {
    fmt::print("{}{}", p.to_text(), rates_text(rates));
  }
  std::fflush(stdout);
}

int run_process(const StatsArgs& a) {
  if (a.prometheus) {
    fmt::print("{}", to_openmetrics({read_process_stats(a.pid, a.dir)}));
    return 0;
  }
  ProcessStats previous = read_process_stats(a.pid, a.dir);
  if (a.watch <= 0) {
    print_process(a, previous, nullptr);
    return 0;
  }
  for (int i = 0; a.repeat == 0 || i < a.repeat; ++i) {
    std::this_thread::sleep_for(std::chrono::duration<double>(a.watch));
    ProcessStats now = read_process_stats(a.pid, a.dir);
    print_process(a, now, &previous);
    if (now.exited) break;
    if (!a.json && (a.repeat == 0 || i + 1 < a.repeat)) fmt::print("\n");
    previous = std::move(now);
  }
  return 0;
}

// --- Every process ----------------------------------------------------------------------------

int run_all(const StatsArgs& a) {
  const std::string dir = a.dir.empty() ? stats_directory() : a.dir;
  const std::vector<ProcessEntry> entries = list_process_stats(dir);
  if (a.prometheus) {
    std::vector<ProcessStats> readable;
    for (const ProcessEntry& e : entries) {
      if (e.stats && !e.stats->exited) {
        readable.push_back(*e.stats);
      } else if (e.state != ProcessEntry::State::kReadable) {
        fmt::print(stderr, "ferry: pid {}: {}\n", e.pid, e.detail);
      }
    }
    fmt::print("{}", to_openmetrics(readable));
    return 0;
  }
  if (a.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const ProcessEntry& e : entries) {
      list.push_back({{"pid", e.pid},
                      {"uid", e.uid},
                      {"state", to_string(e.state)},
                      {"path", e.path},
                      {"detail", e.detail},
                      {"stats", e.stats ? nlohmann::json::parse(e.stats->to_json())
                                        : nlohmann::json(nullptr)}});
    }
    fmt::print("{}\n", nlohmann::json{{"directory", dir}, {"processes", list}}.dump(2));
    return 0;
  }
  if (entries.empty()) {
    fmt::print("no process publishes ferry counters in {}\n", dir);
    return 0;
  }
  fmt::print("{:>8} {:>6} {:<16} {:>10} {:>8} {:>10} {:>10} {:>10}  {}\n", "pid", "uid", "command",
             "requests", "failed", "posix", "cufile", "read", "state");
  for (const ProcessEntry& e : entries) {
    if (e.stats) {
      const ProcessStats& p = *e.stats;
      fmt::print("{:>8} {:>6} {:<16} {:>10} {:>8} {:>10} {:>10} {:>10}  {}\n", e.pid, e.uid,
                 p.command.substr(0, 16), p.totals.requests, p.totals.failed_requests,
                 p.posix.counts.requests(), p.cufile.counts.requests(),
                 format_size(p.totals.bytes_read, true),
                 e.state == ProcessEntry::State::kReadable ? "readable"
                                                           : to_string(e.state) + ": " + e.detail);
    } else {
      fmt::print("{:>8} {:>6} {:<16} {:>10} {:>8} {:>10} {:>10} {:>10}  {}: {}\n", e.pid, e.uid,
                 "?", "-", "-", "-", "-", "-", to_string(e.state), e.detail);
    }
  }
  return 0;
}

int run(const StatsArgs& a) {
  if (a.pid != 0) return run_process(a);
  if (a.all || a.prometheus) return run_all(a);
  return run_system_wide(a);
}

}  // namespace

void add_stats_command(CLI::App& app, std::function<int()>& action) {
  auto args = std::make_shared<StatsArgs>();
  CLI::App* cmd = app.add_subcommand(
      "stats",
      "A process's own counters at both layers (-p PID), every process that publishes them "
      "(--all), or nvidia-fs's system-wide counters (gds_stats)");
  CLI::Option* pid =
      cmd->add_option("-p,--pid", args->pid, "Print this process's ferry counters and rates")
          ->check(whole_number("a process id", 1, kMaxPid));
  CLI::Option* all = cmd->add_flag(
      "--all", args->all,
      "List the processes that publish ferry counters (removing those of exited ones)");
  pid->excludes(all);
  cmd->add_flag("--prometheus", args->prometheus,
                "Print OpenMetrics text (of -p PID, else of every readable process)");
  cmd->add_option("--watch", args->watch,
                  "Print the counters' growth over this many seconds (with -p: and their rates)")
      ->check(seconds_above_zero(kMaxWatchSeconds));
  cmd->add_option("--repeat", args->repeat,
                  "With -p and --watch: intervals to print, 0 for until interrupted (default 1)")
      ->check(whole_number("a count of intervals", 0, 1000000000));
  cmd->add_option("--dir", args->dir,
                  "Read segments from this directory (default: FERRY_STATS_DIR, else /dev/shm)");
  cmd->add_option("--root", args->root,
                  "Read /proc and /sys under this directory instead of / (nvidia-fs counters)");
  cmd->add_flag("--json", args->json, "Print JSON (one object; one per line with --repeat)");
  cmd->callback([args, &action] {
    if (args->prometheus && args->json) {
      throw CLI::ValidationError("--prometheus",
                                 "--prometheus and --json are two formats: pick one");
    }
    action = [args] { return run(*args); };
  });
}

}  // namespace ferry::cli
