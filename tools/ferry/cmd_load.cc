// ferry load: load a safetensors checkpoint (a file, an index or a directory of shards) into one
// GPU or host memory and say how it went: tensors, bytes, seconds, GB/s and each shard's route.
#include <ferry/checkpoint.h>
#include <ferry/printable.h>
#include <ferry/warm_up.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "progress.h"

namespace ferry::cli {
namespace {

struct LoadArgs {
  std::string path;
  MemoryChoice memory;
  SettingsFlags settings;
  std::vector<std::string> tensors;
  bool one_allocation = false;
  bool list = false;
  bool checksum = false;
  bool json = false;
  std::string host_load;  // empty: the host_load setting
};

// SHA-256 of each loaded tensor's bytes, read back from where they landed (GPU or host).
std::vector<std::string> tensor_digests(const LoadResult& result) {
  std::vector<std::string> digests;
  for (const LoadedTensor& t : result.tensors) {
    if (t.mapped) {  // a view of a mapping (host memory): hashed from a copy, as a Buffer
      Buffer copy(MemoryKind::kHostPageable, t.nbytes);
      std::memcpy(copy.data(), t.data, t.nbytes);
      digests.push_back(sha256(copy, t.nbytes));
      continue;
    }
    const Buffer& b = result.memory[t.memory];
    const std::size_t offset =
        t.nbytes == 0 ? 0 : static_cast<const char*>(t.data) - static_cast<const char*>(b.data());
    digests.push_back(sha256(b, t.nbytes, offset));
  }
  return digests;
}

nlohmann::json tensor_json(const TensorInfo& t, const Checkpoint& ckpt) {
  return {{"name", t.name},     {"dtype", to_string(t.dtype)},    {"shape", t.shape},
          {"nbytes", t.nbytes}, {"file", ckpt.shards()[t.shard]}, {"file_offset", t.file_offset}};
}

int run(const LoadArgs& a) {
  const ChosenMemory target = choose_memory_or_throw(a.memory);
  // CUDA's start-up (the GPU's context, staging) is paid once per process, before the clock
  // starts, and reported apart: the load's rate is then comparable with loaders timed after
  // CUDA is up, as users of torch are (bench/model_zoo.py).
  double cuda_start_seconds = 0;
  if (is_gpu(target.memory.kind)) {
    const auto cuda_start = std::chrono::steady_clock::now();
    warm_up(target.memory.device);
    cuda_start_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - cuda_start).count();
  }
  const double cpu0 = cpu_seconds();
  const auto opened = std::chrono::steady_clock::now();
  Checkpoint ckpt(a.path, file_options(a.settings));
  const double open_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - opened).count();
  LoadOptions options;
  options.memory = target.memory.kind;
  options.device = std::max(target.memory.device, 0);
  options.names = a.tensors;
  options.one_allocation = a.one_allocation;
  if (!a.host_load.empty()) options.host_load = parse_host_load(a.host_load, "--host-load");
  const bool show = progress_wanted(a.json);
  ProgressBar bar("loading", ckpt.total_bytes(), show);
  if (show) {
    options.progress.callback = [&bar](std::uint64_t done, std::uint64_t total) {
      bar.update(done, total);
    };
    options.progress.interval_seconds = 0.05;  // the bar keeps its own pace (0.1 s)
  }
  const LoadResult result = ckpt.load(options);
  bar.clear();
  const LoadReport& report = result.report;
  const double cpu = cpu_seconds() - cpu0;
  const std::vector<std::string> digests =
      a.checksum ? tensor_digests(result) : std::vector<std::string>{};
  const std::string where = is_gpu(target.memory.kind) ? fmt::format("GPU {}", target.memory.device)
                                                       : to_string(target.memory.kind);
  if (a.json) {
    const nlohmann::json routes = nlohmann::json::parse(report.to_json());  // both kinds
    nlohmann::json out = {{"checkpoint", shown_path(a.path)},
                          {"shards", ckpt.shards()},
                          {"tensors", report.tensors},
                          {"bytes", report.bytes},
                          {"bytes_read", report.bytes_read},
                          {"open_reads", report.open_reads},
                          {"open_bytes", report.open_bytes},
                          {"skipped", report.skipped},
                          {"seconds", report.seconds},
                          {"allocate_seconds", report.allocate_seconds},
                          {"open_seconds", open_seconds},
                          {"cuda_start_seconds", cuda_start_seconds},
                          {"gbps", gbps(report.bytes, report.seconds)},
                          {"cpu_seconds", cpu},
                          {"one_allocation", a.one_allocation},
                          {"gets", report.gets},
                          {"retries", report.retries},
                          {"connections", report.connections},
                          {"routes", routes["routes"]},
                          {"host_routes", routes["host_routes"]}};
    out.update(memory_json(target));
    if (a.list || a.checksum) {
      nlohmann::json list = nlohmann::json::array();
      for (std::size_t k = 0; k < result.tensors.size(); ++k) {
        list.push_back(tensor_json(ckpt.tensors()[ckpt.find(result.tensors[k].name)], ckpt));
        if (a.checksum) list.back()["sha256"] = digests[k];
      }
      out["tensor_list"] = list;
    }
    fmt::print("{}\n", json_text(out, 2));
    return 0;
  }
  if (!target.note.empty()) fmt::print("note: {}\n", target.note);
  if (a.list || a.checksum) {
    for (std::size_t k = 0; k < result.tensors.size(); ++k) {
      const LoadedTensor& t = result.tensors[k];
      // A name is the file's text: escaped, so that no terminal escape sequence reaches the screen.
      fmt::print("{:<60} {:<8} [{}] {} B{}\n", printable(t.name), to_string(t.dtype),
                 fmt::join(t.shape, ", "), t.nbytes, a.checksum ? " sha256 " + digests[k] : "");
    }
  }
  fmt::print(
      "loaded {} tensors, {} B from {} shard(s) into {} in {:.4f} s: {:.2f} GB/s, {} (allocating "
      "took {:.4f} s of it; headers read in {:.4f} s, {} read(s) of {} B{})\n",
      report.tensors, report.bytes, ckpt.shards().size(), where, report.seconds,
      gbps(report.bytes, report.seconds), cpu_words(cpu, report.bytes), report.allocate_seconds,
      open_seconds, report.open_reads, report.open_bytes,
      is_gpu(target.memory.kind)
          ? fmt::format(", CUDA started in {:.4f} s before", cuda_start_seconds)
          : "");
  if (report.gets > 0) {
    fmt::print(
        "remote: {} GET(s) for {} tensor(s) in {} request(s), {} retries, {} new "
        "connection(s)\n",
        report.gets, report.tensors, report.routes.size(), report.retries, report.connections);
  }
  for (const HostRoute& r : report.host_routes) fmt::print("host route: {}\n", r.describe());
  // One route block per request (a part of a shard); with several, each under its shard's name.
  const std::vector<std::string>& shards = ckpt.shards();
  for (const RouteReport& r : report.routes) {
    if (report.routes.size() > 1) {
      const auto it = std::find(shards.begin(), shards.end(), r.file);
      fmt::print("shard {} of {}: {}\n", it - shards.begin() + 1, shards.size(), r.file);
    }
    fmt::print("{}", r.to_text());
  }
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
  cmd->add_option("--host-load", args->host_load,
                  "Into host memory: map local shards, reading cold ones in before returning "
                  "(auto), map every local shard lazily (map) or read them all (read); default: "
                  "the host_load setting")
      ->check(CLI::IsMember({"auto", "map", "read"}));
  cmd->add_flag("--list", args->list, "Print every tensor loaded: name, dtype, shape, bytes");
  cmd->add_flag("--checksum", args->checksum,
                "Also print each tensor's SHA-256, of its bytes as they landed (implies --list)");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &action] { action = [args] { return run(*args); }; });
}

}  // namespace ferry::cli
