// ferry demo: the article's example end to end. Makes a 1 GiB file in a temporary folder, reads
// it into GPU 0 (or host memory where there is no GPU, and says so), checks every byte against
// what was written, prints the route, and removes the folder.
#include <fmt/format.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"
#include "progress.h"

namespace ferry::cli {
namespace {

struct DemoArgs {
  std::string size = "1GiB";
  std::string dir;
  bool json = false;
};

// Removes the demo folder whatever happens.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& parent) {
    std::string base = parent;
    if (base.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    }
    std::string pattern = (std::filesystem::path(base) / "ferry-demo-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw IoError(errno, "mkdtemp", pattern, 0, 0);
    }
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

int run(const DemoArgs& a) {
  const std::uint64_t size = parse_size(a.size, "--size");
  TempDir dir(a.dir);
  const std::filesystem::path path = dir.path / "demo.bin";

  std::string written_sha;
  {
    Buffer source(MemoryKind::kHostPageable, size);
    fill_pattern(source, "random", 2026);
    written_sha = sha256(source, size);
    File out(path, "w");
    IoFuture written = out.pwrite(source.data(), size, 0);
    wait_with_progress(written, size, "writing", progress_wanted(a.json));
    written.get();
    out.sync();
  }

  const ChosenMemory target = choose_memory_or_throw(MemoryChoice{});
  Buffer buffer(target.memory.kind, size, std::max(target.memory.device, 0));
  File in(path, "r");
  IoFuture future = in.pread(buffer.data(), size, 0);
  wait_with_progress(future, size, "reading", progress_wanted(a.json));
  const std::size_t bytes = future.get();
  const RouteReport route = future.route();
  const std::string read_sha = sha256(buffer, bytes);
  const bool verified = bytes == size && read_sha == written_sha;

  if (a.json) {
    nlohmann::json out = {{"file", path.string()},
                          {"bytes", bytes},
                          {"seconds", route.seconds},
                          {"gbps", gbps(bytes, route.seconds)},
                          {"memory", is_gpu(target.memory.kind) ? "gpu" : "host"},
                          {"device", target.memory.device},
                          {"verified", verified},
                          {"sha256", read_sha},
                          {"route", nlohmann::json::parse(route.to_json())}};
    if (!target.note.empty()) out["note"] = target.note;
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("ferry demo: wrote {} ({} B) to {}\n", format_size(size), size, path.string());
    if (!target.note.empty()) fmt::print("note: {}\n", target.note);
    fmt::print("read it into {}{} in {:.4f} s: {:.2f} GB/s\n", to_string(target.memory.kind),
               is_gpu(target.memory.kind) ? fmt::format(" {}", target.memory.device) : "",
               route.seconds, gbps(bytes, route.seconds));
    fmt::print("{}", route.to_text());
    fmt::print("data {}: sha256 {}\n", verified ? "verified" : "MISMATCH", read_sha);
  }
  if (!verified) {
    throw Error(fmt::format("demo: read {} of {} bytes, sha256 {} but wrote {}", bytes, size,
                            read_sha, written_sha));
  }
  return 0;
}

}  // namespace

void add_demo_command(CLI::App& app, std::function<int()>& action) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "Write a 1 GiB file, read it into GPU 0 (or host memory), verify it, show the route");
  cmd->add_option("--size", args->size, "Size of the demo file (default 1GiB)");
  cmd->add_option("--dir", args->dir,
                  "Folder to make the temporary file in (default $TMPDIR or /tmp)");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &action] { action = [args] { return run(*args); }; });
}

}  // namespace ferry::cli
