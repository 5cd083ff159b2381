// ferry write: write bytes from GPU or host memory to a file. Also how test and benchmark files
// are made. The data goes to a temporary name beside PATH and is renamed over PATH only once
// every byte is written and synced, so a failed write never leaves a file that looks complete.
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"

namespace ferry::cli {
namespace {

struct WriteArgs {
  std::string path;
  std::string size;
  MemoryChoice memory;
  SettingsFlags settings;
  std::string pattern = "random";
  std::uint64_t seed = 1;
  bool no_sync = false;
  bool checksum = false;
  bool json = false;
};

int run(const WriteArgs& a) {
  const std::uint64_t size = size_option(a.size, "--size");
  const Target target = resolve_target(a.memory);
  Buffer buffer(target.kind, size, std::max(target.device, 0));
  fill_pattern(buffer, a.pattern, a.seed);
  const std::string digest = a.checksum ? sha256(buffer, size) : "";

  const std::filesystem::path final_path(a.path);
  const std::filesystem::path temp_path =
      final_path.string() + fmt::format(".ferry-partial-{}", getpid());
  RouteReport route;
  double cpu = 0;
  try {
    File file(temp_path, "w", file_options(a.settings));
    const double cpu0 = cpu_seconds();
    IoFuture future = file.pwrite(buffer.data(), size, 0);
    wait_with_progress(future, size, "writing");
    future.get();
    if (!a.no_sync) file.sync();
    cpu = cpu_seconds() - cpu0;
    route = future.route();
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temp_path, ignored);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(temp_path, final_path, ec);
  if (ec) {
    std::filesystem::remove(temp_path, ec);
    throw IoError(EIO, "rename", final_path.string(), 0, size, 0, ec.message());
  }
  const double cpu_per_gib = size > 0 ? cpu / (static_cast<double>(size) / (1 << 30)) : 0;
  if (a.json) {
    nlohmann::json out = {{"file", a.path},
                          {"bytes", size},
                          {"seconds", route.seconds},
                          {"gbps", gbps(size, route.seconds)},
                          {"cpu_seconds_per_gib", cpu_per_gib},
                          {"memory", is_gpu(target.kind) ? "gpu" : "host"},
                          {"memory_kind", to_string(target.kind)},
                          {"device", target.device},
                          {"synced", !a.no_sync},
                          {"route", nlohmann::json::parse(route.to_json())}};
    if (!target.note.empty()) out["note"] = target.note;
    if (a.checksum) out["sha256"] = digest;
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("wrote {} B to {} from {} in {:.4f} s: {:.2f} GB/s, {:.3f} CPU-s/GiB{}\n", size,
             a.path, to_string(target.kind), route.seconds, gbps(size, route.seconds), cpu_per_gib,
             a.no_sync ? " (not synced)" : "");
  if (!target.note.empty()) fmt::print("note: {}\n", target.note);
  fmt::print("{}", route.to_text());
  if (a.checksum) fmt::print("sha256: {}\n", digest);
  return 0;
}

}  // namespace

void add_write_command(CLI::App& app, std::function<int()>& action) {
  auto args = std::make_shared<WriteArgs>();
  CLI::App* cmd = app.add_subcommand("write", "Write bytes from GPU or host memory to a file");
  cmd->add_option("path", args->path, "File to create or replace")->required();
  cmd->add_option("--size", args->size, "Bytes to write, e.g. 1GiB")->required();
  add_memory_options(*cmd, args->memory);
  add_settings_options(*cmd, args->settings);
  cmd->add_option("--pattern", args->pattern, "random (deterministic from --seed) or zero")
      ->check(CLI::IsMember({"random", "zero"}));
  cmd->add_option("--seed", args->seed, "Seed of the random pattern");
  cmd->add_flag("--no-sync", args->no_sync, "Skip the fsync before the file is renamed into place");
  cmd->add_flag("--checksum", args->checksum, "Print the SHA-256 of the bytes written");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &action] { action = [args] { return run(*args); }; });
}

}  // namespace ferry::cli
