// ferry::plan: how one read will be split before any I/O, at both layers: ferry's own tasks
// (task_size, gds_threshold, compat mode) and, per task, the pieces cuFile's thread pool cuts it
// into (cufile.json execution.*). Pure functions over plain values; thread-safe. Predictions that
// rest on measurement say so, and unknown rules are reported as unknown, never guessed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/settings.h"

namespace ferry {

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

struct PlanRequest {
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  std::uint64_t task_size = std::uint64_t{4} << 20;
  std::uint64_t gds_threshold = std::uint64_t{16} << 10;
  CompatMode compat_mode = CompatMode::kAuto;
  bool buffer_registered = false;
  CufileScheduling cufile;
  // Set where ferry's POSIX path will take every task whatever the file (route_outlook in
  // ferry/explain.h: no GPU, or cuFile could only use its compatibility path): why, in words.
  std::optional<std::string> posix_because;
};

enum class PlanPath {
  kNothing,              // size 0
  kPosixBelowThreshold,  // size < gds_threshold: one POSIX read, cuFile not called
  kPosixCompatOn,        // compat mode on: ferry's POSIX path, cuFile never called
  kCufile,               // tasks go to cuFile (in AUTO only if cuFile opens for this file)
  kPosix,                // ferry's POSIX path, for the reason in PlanRequest::posix_because
};
std::string_view to_string(PlanPath p);

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

struct Plan {
  PlanRequest request;
  PlanPath path = PlanPath::kNothing;
  std::uint64_t task_count = 0;
  std::uint64_t first_task_size = 0;
  std::uint64_t last_task_size = 0;
  std::vector<PlanTaskGroup> groups;  // at most two: the full tasks, then a shorter last one
  std::optional<std::uint64_t> cufile_pieces_total;  // empty when unknown or cuFile not called
  std::vector<std::string> words;                    // the plan in sentences, layer by layer
};

Plan plan(const PlanRequest& request);

// cuFile's pieces for one request of `size` bytes (registered or not: measured identical).
CufilePieces predict_cufile_pieces(std::uint64_t size, bool registered,
                                   const CufileScheduling& cufile);

// The plan as text, one sentence per line.
std::string format_plan(const Plan& p);

}  // namespace ferry
