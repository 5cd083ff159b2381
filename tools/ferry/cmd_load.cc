// ferry load: load a safetensors checkpoint (a file, an index or a directory of shards) into one
// GPU or host memory and say how it went: tensors, bytes, seconds, GB/s and each shard's route.
#include <ferry/checkpoint.h>
#include <ferry/printable.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"

namespace ferry::cli {
namespace {

struct LoadArgs {
  std::string path;
  MemoryChoice memory;
  SettingsFlags settings;
  std::vector<std::string> tensors;
  bool one_allocation = false;
  bool list = false;
  bool json = false;
};

nlohmann::json tensor_json(const TensorInfo& t, const Checkpoint& ckpt) {
  return {{"name", t.name},     {"dtype", to_string(t.dtype)},    {"shape", t.shape},
          {"nbytes", t.nbytes}, {"file", ckpt.shards()[t.shard]}, {"file_offset", t.file_offset}};
}

int run(const LoadArgs& a) {
  const Target target = resolve_target(a.memory);
  const double cpu0 = cpu_seconds();
  const auto opened = std::chrono::steady_clock::now();
  Checkpoint ckpt(a.path, file_options(a.settings));
  const double open_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - opened).count();
  LoadOptions options;
  options.memory = target.kind;
  options.device = std::max(target.device, 0);
  options.names = a.tensors;
  options.one_allocation = a.one_allocation;
  const LoadResult result = ckpt.load(options);
  const LoadReport& report = result.report;
  const double cpu = cpu_seconds() - cpu0;
  const std::string where =
      is_gpu(target.kind) ? fmt::format("GPU {}", target.device) : to_string(target.kind);
  if (a.json) {
    nlohmann::json routes = nlohmann::json::array();
    for (const RouteReport& r : report.routes) routes.push_back(nlohmann::json::parse(r.to_json()));
    nlohmann::json out = {{"checkpoint", a.path},
                          {"shards", ckpt.shards()},
                          {"tensors", report.tensors},
                          {"bytes", report.bytes},
                          {"seconds", report.seconds},
                          {"open_seconds", open_seconds},
                          {"gbps", gbps(report.bytes, report.seconds)},
                          {"cpu_seconds", cpu},
                          {"memory", is_gpu(target.kind) ? "gpu" : "host"},
                          {"memory_kind", to_string(target.kind)},
                          {"device", target.device},
                          {"one_allocation", a.one_allocation},
                          {"routes", routes}};
    if (!target.note.empty()) out["note"] = target.note;
    if (a.list) {
      nlohmann::json list = nlohmann::json::array();
      for (const LoadedTensor& t : result.tensors) {
        list.push_back(tensor_json(ckpt.tensors()[ckpt.find(t.name)], ckpt));
      }
      out["tensor_list"] = list;
    }
    fmt::print("{}\n", json_text(out, 2));
    return 0;
  }
  if (!target.note.empty()) fmt::print("note: {}\n", target.note);
  if (a.list) {
    for (const LoadedTensor& t : result.tensors) {
      // A name is the file's text: escaped, so that no terminal escape sequence reaches the screen.
      fmt::print("{:<60} {:<8} [{}] {} B\n", printable(t.name), to_string(t.dtype),
                 fmt::join(t.shape, ", "), t.nbytes);
    }
  }
  fmt::print(
      "loaded {} tensors, {} B from {} shard(s) into {} in {:.4f} s: {:.2f} GB/s, {} (headers "
      "read in {:.4f} s)\n",
      report.tensors, report.bytes, ckpt.shards().size(), where, report.seconds,
      gbps(report.bytes, report.seconds), cpu_words(cpu, report.bytes), open_seconds);
  for (const RouteReport& r : report.routes) fmt::print("{}", r.to_text());
  return 0;
}

}  // namespace

void add_load_command(CLI::App& app, std::function<int()>& action) {
  auto args = std::make_shared<LoadArgs>();
  CLI::App* cmd = app.add_subcommand(
      "load", "Load a safetensors checkpoint into GPU or host memory and report the route");
  cmd->add_option("checkpoint", args->path,
                  "A .safetensors file, a *.safetensors.index.json, or a directory of shards")
      ->required();
  add_memory_options(*cmd, args->memory);
  add_settings_options(*cmd, args->settings);
  cmd->add_option("--tensor", args->tensors, "Load only this tensor (repeatable)");
  cmd->add_flag("--one-allocation", args->one_allocation,
                "One allocation behind every tensor instead of one each");
  cmd->add_flag("--list", args->list, "Print every tensor loaded: name, dtype, shape, bytes");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &action] { action = [args] { return run(*args); }; });
}

}  // namespace ferry::cli
