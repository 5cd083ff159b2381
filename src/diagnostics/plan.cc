// ferry::plan: layer 1 mirrors the engine: every request is cut from its start offset into
// task_size tasks, the last one shorter; in auto mode a request below gds_threshold takes
// ferry's POSIX path. Layer 2 is predict_cufile_pieces per task that goes to cuFile.
#include "ferry/plan.h"

#include <fmt/format.h>

#include "core/task_splitter.h"
#include "platform/text_file.h"

namespace ferry {
namespace {

using platform::size_words;

std::string_view compat_words(CompatMode m) {
  switch (m) {
    case CompatMode::kAuto:
      return "AUTO";
    case CompatMode::kOn:
      return "ON";
    case CompatMode::kOff:
      return "OFF";
  }
  return "?";
}

}  // namespace

std::string_view to_string(PlanPath p) {
  switch (p) {
    case PlanPath::kNothing:
      return "nothing";
    case PlanPath::kPosixBelowThreshold:
      return "posix-below-threshold";
    case PlanPath::kPosixCompatOn:
      return "posix-compat-on";
    case PlanPath::kCufile:
      return "cufile";
    case PlanPath::kPosix:
      return "posix";
  }
  return "?";
}

Plan plan(const PlanRequest& r) {
  Plan p;
  p.request = r;
  if (r.size == 0) {
    p.path = PlanPath::kNothing;
    p.words.push_back("Nothing to read: the request is 0 bytes.");
    return p;
  }
  const core::TaskShape shape = core::task_shape(r.size, r.task_size == 0 ? r.size : r.task_size);
  const std::uint64_t task = shape.task_size, full = shape.full, rest = shape.rest;
  p.task_count = shape.count();
  p.first_task_size = shape.first_size();
  p.last_task_size = shape.last_size();
  // As the engine's routing does (src/core/routing.cc): the threshold applies in auto mode
  // only; compat_mode=off sends even small requests to cuFile.
  if (r.compat_mode == CompatMode::kAuto && r.size < r.gds_threshold) {
    p.path = PlanPath::kPosixBelowThreshold;
    if (full) p.groups.push_back(PlanTaskGroup{full, task, std::nullopt});
    if (rest) p.groups.push_back(PlanTaskGroup{1, rest, std::nullopt});
    p.words.push_back(fmt::format(
        "ferry: {} is below gds_threshold {}: ferry's POSIX path in {} task(s), cuFile is not "
        "called.",
        size_words(r.size), size_words(r.gds_threshold), p.task_count));
    return p;
  }
  const bool posix = r.compat_mode == CompatMode::kOn || r.posix_because.has_value();
  const bool cufile = !posix;
  p.path = r.compat_mode == CompatMode::kOn
               ? PlanPath::kPosixCompatOn
               : (r.posix_because ? PlanPath::kPosix : PlanPath::kCufile);
  auto group = [&](std::uint64_t count, std::uint64_t size) {
    PlanTaskGroup g{count, size, std::nullopt};
    if (cufile) g.pieces = predict_cufile_pieces(size, r.buffer_registered, r.cufile);
    p.groups.push_back(std::move(g));
  };
  if (full) group(full, task);
  if (rest) group(1, rest);

  std::string split = p.task_count == 1
                          ? fmt::format("1 task of {}", size_words(r.size))
                          : (rest ? fmt::format("{} tasks of {} and a last one of {}", full,
                                                size_words(task), size_words(rest))
                                  : fmt::format("{} tasks of {}", full, size_words(task)));
  p.words.push_back(fmt::format("ferry: {} from offset {} in task_size {}: {}.", size_words(r.size),
                                r.offset, size_words(task), split));
  if (p.path == PlanPath::kPosixCompatOn) {
    p.words.push_back(
        "ferry: compat mode ON: its own POSIX path reads every task; cuFile is never "
        "called.");
    return p;
  }
  if (p.path == PlanPath::kPosix) {
    p.words.push_back(fmt::format(
        "ferry: its own POSIX path reads every task, cuFile is not called: {}.", *r.posix_because));
    return p;
  }
  p.words.push_back(fmt::format(
      "ferry: compat mode {}: each task is one cuFileRead{}.", compat_words(r.compat_mode),
      r.compat_mode == CompatMode::kAuto ? " (if cuFile opens for this file; else ferry's POSIX "
                                           "path, with the reason recorded)"
                                         : ""));
  std::uint64_t total = 0;
  bool all_known = true;
  for (const auto& g : p.groups) {
    const auto& pieces = *g.pieces;
    all_known = all_known && pieces.known;
    total += g.count * pieces.count;
    p.words.push_back(fmt::format("cuFile: each {} request ({} of them): {}.",
                                  size_words(g.task_size), g.count, pieces.words));
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

std::string format_plan(const Plan& p) {
  std::string out;
  for (const auto& w : p.words) {
    out += w;
    out += '\n';
  }
  return out;
}

}  // namespace ferry
