// ferry read: read a file (or part of it) into GPU or host memory and say how it went.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"

namespace ferry::cli {
namespace {

struct ReadArgs {
  std::string path;
  MemoryChoice memory;
  SettingsFlags settings;
  std::string offset = "0";
  std::string size;
  int repeat = 1;
  bool checksum = false;
  bool json = false;
};

int run(const ReadArgs& a) {
  File file(a.path, "r", file_options(a.settings));
  const std::uint64_t offset = offset_option(a.offset, "--offset");
  const std::uint64_t file_size = file.size();
  const std::uint64_t available = file_size > offset ? file_size - offset : 0;
  const std::uint64_t asked = a.size.empty() ? available : size_option(a.size, "--size");
  // Only what the file holds is allocated and read; a shorter read is said, not silent.
  const std::uint64_t size = std::min(asked, available);
  std::string short_note;
  if (offset >= file_size && offset > 0) {
    short_note = fmt::format(
        "--offset {} is at or past the end of the file ({} B): nothing to read", offset, file_size);
  } else if (asked > available) {
    short_note = offset >= file_size
                     ? fmt::format(
                           "--offset {} is at or past the end of the file ({} B): "
                           "nothing to read",
                           offset, file_size)
                     : fmt::format(
                           "the file ends {} B after --offset: reading {} B of the {} B "
                           "asked for",
                           available, available, asked);
  }
  const Target target = resolve_target(a.memory);
  Buffer buffer(target.kind, size, std::max(target.device, 0));
  nlohmann::json runs = nlohmann::json::array();
  RouteReport route;
  std::size_t bytes = 0;
  double best = 0;
  double cpu_per_gib = 0;
  for (int r = 0; r < a.repeat; ++r) {
    const double cpu0 = cpu_seconds();
    IoFuture future = file.pread(buffer.data(), size, offset);
    wait_with_progress(future, size, "reading");
    bytes = future.get();
    route = future.route();
    const double cpu = cpu_seconds() - cpu0;
    cpu_per_gib = bytes > 0 ? cpu / (static_cast<double>(bytes) / (1 << 30)) : 0;
    best = std::max(best, gbps(bytes, route.seconds));
    runs.push_back(
        {{"seconds", route.seconds}, {"gbps", gbps(bytes, route.seconds)}, {"cpu_seconds", cpu}});
    if (!a.json) {
      fmt::print("read {} B from {} into {}{} in {:.4f} s: {:.2f} GB/s, {}\n", bytes, a.path,
                 to_string(target.kind),
                 is_gpu(target.kind) ? fmt::format(" {}", target.device) : "", route.seconds,
                 gbps(bytes, route.seconds), cpu_words(cpu, bytes));
    }
  }
  std::string digest = a.checksum ? sha256(buffer, bytes) : "";
  if (a.json) {
    nlohmann::json out = {{"file", a.path},
                          {"bytes", bytes},
                          {"seconds", route.seconds},
                          {"gbps", gbps(bytes, route.seconds)},
                          {"best_gbps", best},
                          {"cpu_seconds_per_gib", cpu_per_gib},
                          {"memory", is_gpu(target.kind) ? "gpu" : "host"},
                          {"memory_kind", to_string(target.kind)},
                          {"device", target.device},
                          {"runs", runs},
                          {"route", nlohmann::json::parse(route.to_json())}};
    if (!target.note.empty()) out["note"] = target.note;
    if (!short_note.empty()) out["end_of_file"] = short_note;
    if (a.checksum) out["sha256"] = digest;
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  if (!target.note.empty()) fmt::print("note: {}\n", target.note);
  if (!short_note.empty()) fmt::print("note: {}\n", short_note);
  fmt::print("{}", route.to_text());
  if (a.checksum) fmt::print("sha256: {}\n", digest);
  return 0;
}

}  // namespace

void add_read_command(CLI::App& app, std::function<int()>& action) {
  auto args = std::make_shared<ReadArgs>();
  CLI::App* cmd =
      app.add_subcommand("read", "Read a file into GPU or host memory and report the route");
  cmd->add_option("path", args->path, "File to read")->required();
  add_memory_options(*cmd, args->memory);
  add_settings_options(*cmd, args->settings);
  cmd->add_option("--offset", args->offset, "File offset to start at (bytes or units)");
  cmd->add_option("--size", args->size, "Bytes to read (default: to the end of the file)");
  cmd->add_option("--repeat", args->repeat, "Read this many times (1 or more)")
      ->check(CLI::Range(1, 1000000));
  cmd->add_flag("--checksum", args->checksum, "Print the SHA-256 of the bytes that landed");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &action] { action = [args] { return run(*args); }; });
}

}  // namespace ferry::cli
