// ferry::plan: a view of the engine's own plan (core::plan_route, over a file not
// yet named): its route, its tasks cut from the start offset in task_size, the last one shorter;
// and per task that goes to cuFile, predict_cufile_pieces.
#include "ferry/plan.h"

#include <fmt/format.h>

#include <cctype>

#include "backends/paths.h"
#include "core/paths.h"
#include "core/request_plan.h"
#include "core/runtime_state.h"
#include "core/task_splitter.h"
#include "ferry/runtime.h"

namespace ferry {
namespace {

// "AUTO", "ON", "OFF": the words of cuFile's own documentation.
std::string compat_words(CompatMode m) {
  std::string words = to_string(m);
  for (char& c : words) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return words;
}

}  // namespace

ChosenMemory choose_memory(const MemoryChoice& choice) {
  return core::choose_memory(choice, cuda_status());
}

std::string cufile_required_by(const Settings& settings) {
  return core::cufile_required_by(settings);
}

Plan plan(const PlanRequest& r) {
  Plan p;
  p.request = r;
  const core::Environment& env =
      r.runtime ? core::state_of(*r.runtime).env() : backends::default_environment();
  p.settings = env.settings(r.settings);
  ChosenMemory memory = choose_memory({r.gpu, r.host, r.pinned});
  p.memory = memory.memory.kind;
  p.device = memory.memory.device;
  p.memory_note = memory.note;
  core::RequestPlan route = core::plan_route(
      p.settings, env.layer1_view(memory.memory), r.size,
      core::PlanSubject{nullptr, Op::kRead, r.offset, r.size, r.cufile_probe, &env});
  p.path = route.path;
  p.reasons = std::move(route.reasons);
  p.failure = memory.failure ? memory.failure : route.refusal;
  p.file_decides = route.file_decides;
  p.cufile_required_by = route.cufile_required_by;
  if (r.size == 0) {
    p.words.push_back("Nothing to read: the request is 0 bytes.");
    return p;
  }
  const core::TaskShape shape = core::task_shape(r.size, p.settings.task_size);
  const std::uint64_t task = shape.task_size, full = shape.full, rest = shape.rest;
  p.task_count = shape.count();
  p.first_task_size = shape.first_size();
  p.last_task_size = shape.last_size();
  const bool cufile = p.path == Path::kCufile;
  auto group = [&](std::uint64_t count, std::uint64_t size) {
    PlanTaskGroup g{count, size, std::nullopt};
    if (cufile) g.pieces = predict_cufile_pieces(size, r.buffer_registered, r.cufile);
    p.groups.push_back(std::move(g));
  };
  if (full) group(full, task);
  if (rest) group(1, rest);
  const ReasonCode code = p.reasons.empty() ? ReasonCode::kEngine : p.reasons.front().code;
  if (code == ReasonCode::kBelowThreshold) {
    p.words.push_back(fmt::format(
        "ferry: {} is below gds_threshold {}: ferry's POSIX path in {} task(s), cuFile is not "
        "called.",
        format_size(r.size), format_size(p.settings.gds_threshold), p.task_count));
    return p;
  }
  std::string split = p.task_count == 1
                          ? fmt::format("1 task of {}", format_size(r.size))
                          : (rest ? fmt::format("{} tasks of {} and a last one of {}", full,
                                                format_size(task), format_size(rest))
                                  : fmt::format("{} tasks of {}", full, format_size(task)));
  p.words.push_back(fmt::format("ferry: {} from offset {} in task_size {}: {}.",
                                format_size(r.size), r.offset, format_size(task), split));
  if (code == ReasonCode::kCompatModeOn) {
    p.words.push_back(
        "ferry: compat mode ON: its own POSIX path reads every task; cuFile is never "
        "called.");
    return p;
  }
  if (!cufile) {
    p.words.push_back(fmt::format(
        "ferry: its own POSIX path reads every task, cuFile is not called: {}.", reasons_text(p)));
    return p;
  }
  p.words.push_back(fmt::format(
      "ferry: compat mode {}: each task is one cuFileRead{}.", compat_words(p.settings.compat_mode),
      p.file_decides && p.cufile_required_by.empty()
          ? " (if cuFile opens for this file; else ferry's POSIX path, with the reason recorded)"
          : ""));
  std::uint64_t total = 0;
  bool all_known = true;
  for (const auto& g : p.groups) {
    const auto& pieces = *g.pieces;
    all_known = all_known && pieces.known;
    total += g.count * pieces.count;
    p.words.push_back(fmt::format("cuFile: each {} request ({} of them): {}.",
                                  format_size(g.task_size), g.count, pieces.words));
  }
  if (all_known) {
    p.cufile_pieces_total = total;
    p.words.push_back(fmt::format(
        "cuFile: {} request{}, {} piece{} in all (its level-3 stats count pieces; pieces are "
        "scheduling units of its thread pool, not single storage transfers). cufile.json: {}.",
        p.task_count, p.task_count == 1 ? "" : "s", total, total == 1 ? "" : "s", r.cufile.source));
  }
  return p;
}

std::string reasons_text(const Plan& p) {
  std::string out;
  for (const RouteReason& reason : p.reasons) out += (out.empty() ? "" : "; ") + reason.text;
  return out;
}

std::string format_plan(const Plan& p) {
  std::string out;
  for (const auto& w : p.words) {
    out += w;
    out += '\n';
  }
  return out;
}

}  // namespace ferry
