// ferry read: read a file (or part of it) into GPU or host memory and say how it went. With
// several GPUs (--gpu 0,1 or --gpu all) the range is split into one contiguous part per GPU and
// the parts are read at once, each GPU on a ferry::Runtime of its own (workers and staging
// memory that no other GPU's reads wait for).
#include <fmt/format.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "commands.h"
#include "common.h"
#include "progress.h"

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

// [offset, offset + size) in `parts` contiguous pieces, cut on 4 KiB boundaries of the file.
std::vector<std::pair<std::uint64_t, std::uint64_t>> split_range(std::uint64_t offset,
                                                                 std::uint64_t size, int parts) {
  constexpr std::uint64_t kAlign = 4096;
  std::vector<std::uint64_t> cuts{offset};
  for (int k = 1; k < parts; ++k) {
    const std::uint64_t ideal =
        offset + static_cast<std::uint64_t>(static_cast<long double>(size) * k / parts);
    std::uint64_t cut = (ideal + kAlign / 2) / kAlign * kAlign;
    cut = std::min(std::max(cut, cuts.back()), offset + size);
    cuts.push_back(cut);
  }
  cuts.push_back(offset + size);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> out;
  for (int k = 0; k < parts; ++k) out.emplace_back(cuts[k], cuts[k + 1] - cuts[k]);
  return out;
}

int run_several(const ReadArgs& a, const std::vector<int>& gpus, std::uint64_t offset,
                std::uint64_t size, const std::string& short_note) {
  const std::string shown = shown_path(a.path);  // every output: a URL without its credentials
  const auto parts = split_range(offset, size, static_cast<int>(gpus.size()));
  // Declared before the Files, so destroyed after them (a runtime outlives its Files' close()).
  std::vector<std::unique_ptr<Runtime>> runtimes;
  std::vector<File> files;
  std::vector<Buffer> buffers;
  for (std::size_t k = 0; k < gpus.size(); ++k) {
    runtimes.push_back(std::make_unique<Runtime>());
    FileOptions options = file_options(a.settings);
    options.runtime = runtimes.back().get();
    files.emplace_back(a.path, "r", options);
    buffers.emplace_back(MemoryKind::kDevice, parts[k].second, gpus[k]);
  }
  nlohmann::json runs = nlohmann::json::array();
  std::vector<RouteReport> routes(gpus.size());
  std::vector<std::size_t> got(gpus.size(), 0);
  std::uint64_t bytes = 0;
  double wall = 0;
  double best = 0;
  double cpu_per_gib = 0;
  for (int r = 0; r < a.repeat; ++r) {
    const double cpu0 = cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    std::vector<IoFuture> futures;
    for (std::size_t k = 0; k < gpus.size(); ++k) {
      futures.push_back(files[k].pread(buffers[k].data(), parts[k].second, parts[k].first));
    }
    {
      ProgressBar bar("reading", size, progress_wanted(a.json));
      for (const IoFuture& f : futures) {
        while (!f.wait_for(0.05)) {
          std::uint64_t done = 0;
          for (const IoFuture& g : futures) done += g.progress();
          bar.update(std::min(done, size));
        }
      }
    }
    bytes = 0;
    for (std::size_t k = 0; k < gpus.size(); ++k) {
      got[k] = futures[k].get();
      routes[k] = futures[k].route();
      bytes += got[k];
    }
    wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = cpu_seconds() - cpu0;
    cpu_per_gib = cpu_seconds_per_gib(cpu, bytes);
    best = std::max(best, gbps(bytes, wall));
    nlohmann::json per = nlohmann::json::array();
    for (std::size_t k = 0; k < gpus.size(); ++k) {
      per.push_back({{"device", gpus[k]},
                     {"seconds", routes[k].seconds},
                     {"gbps", gbps(got[k], routes[k].seconds)}});
    }
    runs.push_back(
        {{"seconds", wall}, {"gbps", gbps(bytes, wall)}, {"cpu_seconds", cpu}, {"parts", per}});
    if (!a.json) {
      std::string line;
      for (std::size_t k = 0; k < gpus.size(); ++k) {
        line += fmt::format("{}GPU {} {:.2f} GB/s", k ? ", " : "", gpus[k],
                            gbps(got[k], routes[k].seconds));
      }
      fmt::print("read {} B from {} into {} GPUs in {:.4f} s: {:.2f} GB/s in all ({}), {}\n", bytes,
                 shown, gpus.size(), wall, gbps(bytes, wall), line, cpu_words(cpu, bytes));
    }
  }
  std::vector<std::pair<const Buffer*, std::size_t>> pieces;
  for (std::size_t k = 0; k < gpus.size(); ++k) pieces.emplace_back(&buffers[k], got[k]);
  const std::string digest = a.checksum ? sha256(pieces) : "";
  if (a.json) {
    nlohmann::json per = nlohmann::json::array();
    for (std::size_t k = 0; k < gpus.size(); ++k) {
      per.push_back({{"device", gpus[k]},
                     {"offset", parts[k].first},
                     {"bytes", got[k]},
                     {"seconds", routes[k].seconds},
                     {"gbps", gbps(got[k], routes[k].seconds)},
                     {"route", nlohmann::json::parse(routes[k].to_json())}});
    }
    nlohmann::json out = {{"file", shown},     {"bytes", bytes},
                          {"seconds", wall},   {"gbps", gbps(bytes, wall)},
                          {"best_gbps", best}, {"cpu_seconds_per_gib", cpu_per_gib},
                          {"memory", "gpu"},   {"memory_kind", to_string(MemoryKind::kDevice)},
                          {"devices", gpus},   {"parts", per},
                          {"runs", runs}};
    if (!short_note.empty()) out["end_of_file"] = short_note;
    if (a.checksum) out["sha256"] = digest;
    fmt::print("{}\n", json_text(out, 2));
    return 0;
  }
  if (!short_note.empty()) fmt::print("note: {}\n", short_note);
  for (std::size_t k = 0; k < gpus.size(); ++k) {
    fmt::print("GPU {}: {} B at offset {} in {:.4f} s: {:.2f} GB/s\n{}", gpus[k], got[k],
               parts[k].first, routes[k].seconds, gbps(got[k], routes[k].seconds),
               routes[k].to_text());
  }
  if (a.checksum) fmt::print("sha256: {}\n", digest);
  return 0;
}

int run(const ReadArgs& a) {
  File file(a.path, "r", file_options(a.settings));
  const std::string shown = shown_path(a.path);  // every output: a URL without its credentials
  // After the file is opened, where --gpu 0 has always checked the driver.
  std::vector<int> gpus;
  if (!a.memory.gpu_list.empty()) gpus = resolve_gpus(parse_gpu_list(a.memory.gpu_list));
  const std::uint64_t offset = parse_offset(a.offset, "--offset");
  const std::uint64_t file_size = file.size();
  const std::uint64_t available = file_size > offset ? file_size - offset : 0;
  const std::uint64_t asked = a.size.empty() ? available : parse_size(a.size, "--size");
  // Only what the file holds is allocated and read; a shorter read is said, not silent.
  const std::uint64_t size = std::min(asked, available);
  std::string short_note;
  if (offset >= file_size && (offset > 0 || asked > available)) {
    short_note = fmt::format(
        "--offset {} is at or past the end of the file ({} B): nothing to read", offset, file_size);
  } else if (asked > available) {
    short_note =
        fmt::format("the file ends {} B after --offset: reading {} B of the {} B asked for",
                    available, available, asked);
  }
  if (gpus.size() > 1) {
    file.close();
    return run_several(a, gpus, offset, size, short_note);
  }
  MemoryChoice memory = a.memory;
  if (gpus.size() == 1) memory.gpu = gpus.front();
  const ChosenMemory target = choose_memory_or_throw(memory);
  Buffer buffer(target.memory.kind, size, std::max(target.memory.device, 0));
  nlohmann::json runs = nlohmann::json::array();
  RouteReport route;
  std::size_t bytes = 0;
  double best = 0;
  double cpu_per_gib = 0;
  for (int r = 0; r < a.repeat; ++r) {
    const double cpu0 = cpu_seconds();
    IoFuture future = file.pread(buffer.data(), size, offset);
    wait_with_progress(future, size, "reading", progress_wanted(a.json));
    bytes = future.get();
    route = future.route();
    const double cpu = cpu_seconds() - cpu0;
    cpu_per_gib = cpu_seconds_per_gib(cpu, bytes);
    best = std::max(best, gbps(bytes, route.seconds));
    runs.push_back(
        {{"seconds", route.seconds}, {"gbps", gbps(bytes, route.seconds)}, {"cpu_seconds", cpu}});
    if (!a.json) {
      fmt::print("read {} B from {} into {}{} in {:.4f} s: {:.2f} GB/s, {}\n", bytes, shown,
                 to_string(target.memory.kind),
                 is_gpu(target.memory.kind) ? fmt::format(" {}", target.memory.device) : "",
                 route.seconds, gbps(bytes, route.seconds), cpu_words(cpu, bytes));
    }
  }
  std::string digest = a.checksum ? sha256(buffer, bytes) : "";
  if (a.json) {
    nlohmann::json out = {{"file", shown},
                          {"bytes", bytes},
                          {"seconds", route.seconds},
                          {"gbps", gbps(bytes, route.seconds)},
                          {"best_gbps", best},
                          {"cpu_seconds_per_gib", cpu_per_gib},
                          {"runs", runs},
                          {"route", nlohmann::json::parse(route.to_json())}};
    out.update(memory_json(target));
    if (!short_note.empty()) out["end_of_file"] = short_note;
    if (a.checksum) out["sha256"] = digest;
    fmt::print("{}\n", json_text(out, 2));
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
      app.add_subcommand("read",
                         "Read a file into GPU or host memory (or split across several GPUs) and "
                         "report the route");
  cmd->add_option("path", args->path, "File to read")->required();
  add_memory_options(*cmd, args->memory, /*several_gpus=*/true);
  add_settings_options(*cmd, args->settings);
  cmd->add_option("--offset", args->offset, "File offset to start at (bytes or units)");
  cmd->add_option("--size", args->size, "Bytes to read (default: to the end of the file)");
  cmd->add_option("--repeat", args->repeat, "Read this many times (1 or more)")
      ->check(whole_number("a number of reads", 1, 1000000));
  cmd->add_flag("--checksum", args->checksum, "Print the SHA-256 of the bytes that landed");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &action] { action = [args] { return run(*args); }; });
}

}  // namespace ferry::cli
