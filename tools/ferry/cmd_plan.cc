// ferry plan: how one read will be split, into ferry's tasks and then into cuFile's pieces, from
// the settings and cufile.json; no file is touched.
#include <ferry/plan.h>
#include <fmt/format.h>
#include <stdlib.h>

#include <climits>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"

namespace ferry::cli {
namespace {

struct PlanArgs {
  MemoryChoice memory;
  std::string size;
  std::string task_size;
  std::string threshold;
  std::string threads;
  std::string compat;
  std::string cufile_json;
  std::string offset = "0";
  std::string root = "/";
  bool registered = false;
  bool json = false;
};

nlohmann::json opt_json(const auto& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

// The path in the words of `ferry plan --json` (docs/cli.md).
std::string path_words(const Plan& p) {
  if (p.request.size == 0) return "nothing";
  if (p.path == Path::kCufile) return "cufile";
  const ReasonCode code = p.reasons.empty() ? ReasonCode::kEngine : p.reasons.front().code;
  if (code == ReasonCode::kBelowThreshold) return "posix-below-threshold";
  if (code == ReasonCode::kCompatModeOn) return "posix-compat-on";
  return "posix";
}

nlohmann::json plan_json(const Plan& p, std::size_t threads) {
  using nlohmann::json;
  const PlanRequest& r = p.request;
  json groups = json::array();
  for (const auto& g : p.groups) {
    json pieces = nullptr;
    if (g.pieces) {
      pieces = {{"known", g.pieces->known},
                {"count", g.pieces->count},
                {"first_size", g.pieces->first_size},
                {"last_size", g.pieces->last_size},
                {"measured", g.pieces->count_measured},
                {"words", g.pieces->words}};
    }
    groups.push_back({{"count", g.count}, {"task_size", g.task_size}, {"pieces", pieces}});
  }
  const std::string path = path_words(p);
  const bool cufile = path == "cufile";
  return {
      {"request",
       {{"size", r.size},
        {"offset", r.offset},
        {"task_size", p.settings.task_size},
        {"gds_threshold", p.settings.gds_threshold},
        {"compat_mode", to_string(p.settings.compat_mode)},
        {"registered", r.buffer_registered},
        {"threads", threads}}},
      {"cufile",
       {{"parallel_io", opt_json(r.cufile.parallel_io)},
        {"min_io_threshold_size_kb", opt_json(r.cufile.min_io_threshold_size_kb)},
        {"max_request_parallelism", opt_json(r.cufile.max_request_parallelism)},
        {"source", r.cufile.source},
        {"unknown_reason", r.cufile.unknown_reason}}},
      {"path", path},
      {"posix_because", path == "posix" ? json(reasons_text(p)) : json(nullptr)},
      {"tasks", p.task_count},
      {"first_task_size", p.first_task_size},
      {"last_task_size", p.last_task_size},
      {"cufile_requests", cufile ? p.task_count : 0},
      {"cufile_pieces_total", cufile ? opt_json(p.cufile_pieces_total) : json(0)},
      {"groups", groups},
      {"words", p.words},
  };
}

int run(const PlanArgs& a) {
  const Settings base = settings();
  PlanRequest r;
  r.size = parse_size(a.size, "--size");
  r.offset = parse_offset(a.offset, "--offset");
  // The limits a read would meet: the engine refuses ranges past off_t (EOVERFLOW) and task
  // sizes out of range (SettingError), so a plan of them would describe a read that cannot run.
  if (r.offset > static_cast<std::uint64_t>(LLONG_MAX) ||
      r.size > static_cast<std::uint64_t>(LLONG_MAX) - r.offset) {
    throw Error(
        fmt::format("--offset {} + --size {} goes past the largest file offset (2^63 - 1 "
                    "bytes): such a read fails with EOVERFLOW",
                    r.offset, r.size));
  }
  if (!a.task_size.empty()) r.settings.task_size = parse_size(a.task_size, "--task-size");
  if (!a.threshold.empty()) r.settings.gds_threshold = parse_size(a.threshold, "--threshold");
  if (!a.compat.empty()) r.settings.compat_mode = parse_compat_mode(a.compat, "--compat");
  r.settings.apply_to(base);  // throws SettingError naming task_size
  r.gpu = a.memory.gpu;
  r.host = a.memory.host;
  r.pinned = a.memory.pinned;
  r.buffer_registered = a.registered;
  if (!a.cufile_json.empty()) {
    // cuFile's own rule for finding its file; the reader follows it.
    std::filesystem::path f = std::filesystem::absolute(a.cufile_json);
    if (!std::filesystem::exists(f))
      throw Error("--cufile-json " + a.cufile_json + ": no such file");
    setenv("CUFILE_ENV_PATH_JSON", f.c_str(), 1);
  }
  r.cufile = read_cufile_scheduling(a.root);
  const Plan p = plan(r);
  if (p.failure) throw Error("plan: the read would fail: " + *p.failure);
  const std::size_t threads =
      a.threads.empty() ? workers_for(base, is_gpu(p.memory)) : parse_count(a.threads, "--threads");
  if (a.json) {
    fmt::print("{}\n", plan_json(p, threads).dump(2));
    return 0;
  }
  const std::string path = path_words(p);
  std::string summary;
  if (path == "nothing") {
    summary = "nothing to read";
  } else if (path == "posix-below-threshold") {
    summary = fmt::format("1 POSIX read of {}, below gds_threshold {}: cuFile is not called",
                          format_size(r.size), format_size(p.settings.gds_threshold));
  } else if (path == "posix-compat-on") {
    summary = fmt::format("{} task(s) on ferry's POSIX path (compat_mode=on)", p.task_count);
  } else if (path == "posix") {
    summary = fmt::format("{} task(s) on ferry's POSIX path, cuFile is not called: {}",
                          p.task_count, reasons_text(p));
  } else {
    summary = fmt::format("{} cuFile request(s)", p.task_count);
    for (const auto& g : p.groups) {
      summary += fmt::format("{} {} x {}: {}", &g == &p.groups.front() ? ";" : ",", g.count,
                             format_size(g.task_size), g.pieces->words);
    }
    summary += p.cufile_pieces_total ? fmt::format("; {} piece(s) in all", *p.cufile_pieces_total)
                                     : "; cuFile's pieces unknown";
  }
  fmt::print("plan: {}\n", summary);
  fmt::print("{}", format_plan(p));
  if (p.task_count > 1) fmt::print("ferry: its pool runs up to {} task(s) at a time.\n", threads);
  return 0;
}

}  // namespace

void add_plan_command(CLI::App& app, std::function<int()>& action) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Show how a read is split into ferry's tasks and cuFile's pieces, before any I/O");
  cmd->add_option("--size", args->size, "Bytes to read, e.g. 1GiB")->required();
  add_memory_options(*cmd, args->memory);
  cmd->add_option("--task-size", args->task_size, "Task size (default: FERRY_TASK_SIZE or 4MiB)");
  cmd->add_option("--threshold", args->threshold,
                  "gds_threshold (default: FERRY_GDS_THRESHOLD or 16KiB)");
  cmd->add_option("--threads", args->threads,
                  "ferry's worker threads, as in ferry read (default: FERRY_NTHREADS for GPU "
                  "memory, FERRY_HOST_NTHREADS for host memory)");
  cmd->add_option("--compat", args->compat, "compat mode: auto, on or off");
  cmd->add_option(
      "--cufile-json", args->cufile_json,
      "cufile.json to plan with (default: CUFILE_ENV_PATH_JSON, else /etc/cufile.json)");
  cmd->add_flag("--registered", args->registered, "The GPU buffer is registered with cuFile");
  cmd->add_option("--offset", args->offset, "File offset of the read");
  cmd->add_option("--root", args->root, "Read /etc under this directory instead of /");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &action] { action = [args] { return run(*args); }; });
}

}  // namespace ferry::cli
