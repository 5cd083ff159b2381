// The one plan of a request's route (layer 1): which path, by which rule, with which reasons and
// refusal, made by plan_route() over every fact (the small path asks the walk alone over the
// cheap ones: cheap_walk). The rule-to-reason mapping and "which memory would a read use" are
// here and nowhere else. Not thread-safe: one per request.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/open_file.h"
#include "core/paths.h"
#include "core/routing.h"
#include "ferry/memory.h"
#include "ferry/plan.h"
#include "ferry/route.h"
#include "ferry/settings.h"

namespace ferry::core {

struct RequestPlan {
  Layer1Walk walk;                            // the rule that decided
  Path path = Path::kPosix;                   // decided walks only
  ReasonCode code = ReasonCode::kHostBuffer;  // the first reason's code (memory.note: no driver)
  std::vector<RouteReason> reasons;
  std::optional<std::string> refusal;  // the settings forbid the only possible path
  std::string cufile_required_by;      // core/routing.h
  PageCacheResidency residency;        // measured for a File's reads
  AcceleratedProbe probe;              // over a File, where the rule probed
  // Over a hypothetical file: the probe was left to the file (path is kCufile).
  bool file_decides = false;
};

// What a plan is made over. `file` null: a hypothetical local file, cold,
// whose cuFile outlook is the process's and whose probe `probe` answers (nullopt: left to the
// file; then nullopt inside: usable; else why not).
struct PlanSubject {
  OpenFile* file = nullptr;
  Op op = Op::kRead;
  std::uint64_t offset = 0;
  std::uint64_t span = 0;  // the bytes a read's residency is measured over
  std::optional<std::optional<std::string>> probe;
  // A hypothetical file's environment (whose cuFile outlook it asks): required where `file` is
  // null (core cannot name the default one: backends/ composes it).
  const Environment* env = nullptr;
};

// `memory`: the memory layer 1 decides on (Environment::layer1_view of the buffer's); `size`: the
// bytes the request moves.
RequestPlan plan_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                       const PlanSubject& subject);

// The walk over the cheap facts alone (remote, settings, memory, cuFile's outlook; undecided
// where a rule needs the residency or the probe), without a plan around it: what the small path
// asks before each request (bench/NOTES.md §30: a RequestPlan cost more than the walk).
Layer1Walk cheap_walk(const Settings& settings, bool gpu_memory, std::size_t size, OpenFile& file);

// The same over facts the caller supplies (the small path's report; the table tests): the walk,
// the reasons and the refusal.
RequestPlan plan_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                       Layer1Asks& asks, const PageCacheResidency& residency);

// The reason code of a rule that sent a request to ferry's POSIX path (`no_driver`: the buffer is
// host memory because there is no CUDA driver).
ReasonCode reason_code(Layer1Rule rule, bool no_driver);

// ferry::choose_memory (ferry/plan.h) over the CUDA driver `cuda`.
ChosenMemory choose_memory(const MemoryChoice& choice, const CudaStatus& cuda);

}  // namespace ferry::core
