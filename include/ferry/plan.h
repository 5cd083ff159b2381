// ferry::plan: how one read will be routed and split before any I/O, at both layers: ferry's own
// route and tasks (the engine's plan, core::plan_route, at predict depth) and, per task, the
// pieces cuFile's thread pool cuts it into (cufile.json execution.*). Thread-safe. Predictions
// that rest on measurement say so, and unknown rules are reported as unknown, never guessed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ferry/memory.h"
#include "ferry/route.h"
#include "ferry/settings.h"

namespace ferry {

class Runtime;

// The cufile.json values cuFile's splitting depends on. Defaults are the stock ones.
struct CufileScheduling {
  std::optional<bool> parallel_io = true;
  std::optional<std::uint64_t> min_io_threshold_size_kb = 8192;
  std::optional<std::uint64_t> max_request_parallelism = 4;
  std::string source = "cuFile's documented defaults";  // where the values came from, in words
  std::string unknown_reason;                           // why a value above is empty, when one is
};

// Reads cufile.json (CUFILE_ENV_PATH_JSON or /etc/cufile.json under `root`) with this process's
// environment.
CufileScheduling read_cufile_scheduling(const std::filesystem::path& root = "/");

// The memory a read with these choices uses, as `ferry read`, plan and explain choose it: the GPU
// asked for, pinned or pageable host memory when asked for, else GPU 0 where the CUDA driver sees
// one, else host memory.
struct MemoryChoice {
  std::optional<int> gpu;
  bool host = false;
  bool pinned = false;
};
struct ChosenMemory {
  MemoryInfo memory;                   // as layer 1 classifies it (note: no CUDA driver)
  std::string note;                    // why host memory when it was not asked for
  std::optional<std::string> failure;  // the memory cannot be had
};
// Asks the CUDA driver.
ChosenMemory choose_memory(const MemoryChoice& choice);

struct PlanRequest {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  // The memory the read uses, as `ferry read` chooses it: by default GPU 0 where the CUDA driver
  // sees one, else host memory.
  std::optional<int> gpu;
  bool host = false;          // pageable host memory
  bool pinned = false;        // pinned host memory
  SettingsOverride settings;  // on top of the process-wide settings
  bool buffer_registered = false;
  CufileScheduling cufile;
  // What cuFile's probe would say of the file, where the caller knows it (ferry check: whether
  // cuFile's driver opens): nullopt: left to the file; then nullopt inside: cuFile opens; else
  // why it does not.
  std::optional<std::optional<std::string>> cufile_probe;
  // The runtime the read would run on (FileOptions::runtime), whose environment (cuFile's
  // outlook, the memory layer 1 sees) decides; null: the process's default.
  Runtime* runtime = nullptr;
};

// How cuFile cuts one request it receives.
struct CufilePieces {
  bool known = false;
  std::uint64_t count = 0;
  std::uint64_t first_size = 0;  // every piece but the last
  std::uint64_t last_size = 0;
  bool count_measured = false;  // this size falls in a case measured on cuFile 1.15
  std::string words;            // "2 pieces of 8 MiB" or why it is unknown
};

// `count` consecutive tasks of `task_size` bytes, each cut by cuFile into `pieces`.
struct PlanTaskGroup {
  std::uint64_t count = 0;
  std::uint64_t task_size = 0;
  std::optional<CufilePieces> pieces;  // empty when cuFile is not called
};

// The prediction of one read before any I/O: the engine's own plan (src/core/plan.h) at predict
// depth over a file not yet named, then its tasks and cuFile's pieces.
struct Plan {
  PlanRequest request;
  Settings settings;  // the effective settings
  MemoryKind memory = MemoryKind::kHostPageable;
  int device = -1;
  std::string memory_note;  // why host memory when it was not asked for
  // Layer 1 as the engine decides it. kCufile with file_decides: the file's own facts (page
  // cache, file system, registration) may still send it to ferry's POSIX path, with a reason.
  Path path = Path::kPosix;
  std::vector<RouteReason> reasons;    // why ferry's POSIX path, when it is
  std::optional<std::string> failure;  // the read would fail, and why
  bool file_decides = false;
  // Where the settings make cuFile a requirement ("compat_mode=off", "require=gds"): a read
  // cuFile cannot serve then fails. Empty in auto mode.
  std::string cufile_required_by;
  std::uint64_t task_count = 0;
  std::uint64_t first_task_size = 0;
  std::uint64_t last_task_size = 0;
  std::vector<PlanTaskGroup> groups;  // at most two: the full tasks, then a shorter last one
  std::optional<std::uint64_t> cufile_pieces_total;  // empty when unknown or cuFile not called
  std::vector<std::string> words;                    // the plan in sentences, layer by layer
};

// Consults the CUDA driver (which memory) and cuFile's outlook (the runtime's), as a read would.
Plan plan(const PlanRequest& request);

// cuFile's pieces for one request of `size` bytes (registered or not: measured identical).
CufilePieces predict_cufile_pieces(std::uint64_t size, bool registered,
                                   const CufileScheduling& cufile);

// The reasons for ferry's POSIX path, joined by "; ".
std::string reasons_text(const Plan& p);

// Where the settings make cuFile a requirement ("compat_mode=off", "require=cufile",
// "require=gds"): a read it cannot serve then fails before any I/O. Empty in auto mode.
std::string cufile_required_by(const Settings& settings);

// The plan as text, one sentence per line.
std::string format_plan(const Plan& p);

}  // namespace ferry
