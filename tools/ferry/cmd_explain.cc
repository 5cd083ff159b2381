// ferry explain: the route a read of PATH would take, at both layers, and every fact that blocks
// the accelerated path; the file is opened but nothing is read.
#include <ferry/explain.h>
#include <fmt/format.h>

#include "commands.h"
#include "common.h"

namespace ferry::cli {
namespace {

struct ExplainArgs {
  std::string path;
  MemoryChoice memory;
  SettingsFlags settings;
  std::string offset = "0";
  std::string size;
  std::string threshold;
  std::string root = "/";
  bool json = false;
};

int run(const ExplainArgs& a) {
  ExplainRequest r;
  r.gpu = a.memory.gpu;
  r.host = a.memory.host;
  r.pinned = a.memory.pinned;
  if (!a.size.empty()) r.size = parse_size(a.size, "--size");
  r.offset = parse_offset(a.offset, "--offset");
  FileOptions options = file_options(a.settings);
  r.direct = options.direct;
  r.settings = options.settings;
  if (!a.threshold.empty()) r.settings.gds_threshold = parse_size(a.threshold, "--threshold");
  r.root = a.root;
  Explanation e = explain(a.path, r);
  fmt::print("{}", a.json ? e.to_json() + "\n" : e.to_text());
  // The read's own exit status, after the whole report (docs/cli.md, "Errors and exit status"):
  // `ferry explain F --gpu 0 && ferry read F --gpu 0` reads only what would not fail.
  return e.failure ? 1 : 0;
}

}  // namespace

void add_explain_command(CLI::App& app, std::function<int()>& action) {
  auto args = std::make_shared<ExplainArgs>();
  CLI::App* cmd = app.add_subcommand(
      "explain", "Predict the route a read of PATH would take, and what blocks the fast path");
  cmd->add_option("path", args->path, "File to explain")->required();
  add_memory_options(*cmd, args->memory);
  add_settings_options(*cmd, args->settings);
  cmd->add_option("--threshold", args->threshold, "gds_threshold (default: FERRY_GDS_THRESHOLD)");
  cmd->add_option("--offset", args->offset, "File offset of the read");
  cmd->add_option("--size", args->size, "Bytes to read (default: to the end of the file)");
  cmd->add_option("--root", args->root,
                  "Read /proc, /sys, /run/udev and /etc under this directory instead of /");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &action] { action = [args] { return run(*args); }; });
}

}  // namespace ferry::cli
