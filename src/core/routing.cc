#include "core/routing.h"

#include <fmt/format.h>

namespace ferry::core {

RouteDecision decide_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                           const std::optional<std::string>& cufile_unavailable) {
  RouteFacts facts;
  facts.compat_only = [] { return std::nullopt; };
  facts.probe_cufile = [&] { return cufile_unavailable; };
  return decide_route(settings, memory, size, facts);
}

RouteDecision decide_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                           const RouteFacts& facts) {
  RouteDecision d;
  std::optional<std::string> why;
  auto posix = [&](ReasonCode code, std::string text) {
    d.path = Path::kPosix;
    d.reasons.push_back({code, std::move(text)});
  };
  // The speed rules apply in auto mode without strict mode: compat_mode=off and require=cufile
  // or gds are the user's ways to insist on cuFile.
  const bool by_speed =
      settings.compat_mode == CompatMode::kAuto && settings.require == Require::kAny;
  if (settings.compat_mode == CompatMode::kOn) {
    posix(ReasonCode::kCompatModeOn, "compat_mode=on: cuFile is never called");
  } else if (!is_gpu(memory.kind)) {
    // cuFile is only worth calling for GPU memory; host buffers are read straight in.
    std::string text = fmt::format("{} buffer: cuFile serves GPU memory", to_string(memory.kind));
    if (!memory.note.empty()) text += fmt::format(" ({})", memory.note);
    posix(memory.note.empty() ? ReasonCode::kHostBuffer : ReasonCode::kNoCudaDriver, text);
  } else if (settings.compat_mode == CompatMode::kAuto && size < settings.gds_threshold) {
    posix(ReasonCode::kBelowThreshold,
          fmt::format("request {} B below gds_threshold {} B", size, settings.gds_threshold));
  } else if (by_speed && (why = facts.compat_only())) {
    // Measured on the GPU machine: cuFile's compatibility path reads with O_DIRECT at the
    // disk's 1.5 GB/s where ferry's POSIX path reads cached data at 52 GB/s (bench/NOTES.md §6).
    posix(ReasonCode::kCufileCompatOnly,
          fmt::format("cuFile could only use its POSIX compatibility path ({}), which is slower "
                      "than ferry's POSIX path; compat_mode=off forces cuFile",
                      *why));
  } else if (by_speed && facts.residency.known && facts.residency.fraction() >= kPageCacheFirst) {
    posix(ReasonCode::kPageCacheResident,
          fmt::format("the range is in the page cache ({}): ferry's POSIX path copies it from "
                      "memory, where cuFile's accelerated path would read the disk",
                      describe(facts.residency)));
  } else if ((why = facts.probe_cufile())) {
    posix(ReasonCode::kCufileUnavailable, *why);
    if (settings.compat_mode == CompatMode::kOff) {
      d.refusal = fmt::format("compat_mode=off requires cuFile, which is unavailable: {}", *why);
    }
  } else {
    d.path = Path::kCufile;
  }
  if (!d.refusal && d.path == Path::kPosix && settings.require != Require::kAny) {
    d.refusal = fmt::format("require={} refuses ferry's POSIX path: {}",
                            to_string(settings.require), d.reasons.back().text);
  }
  return d;
}

std::optional<std::string> refuse_layer2(const Settings& settings, const RouteReport& report,
                                         bool compat_refused_at_open, std::string* unjudged) {
  if (settings.require != Require::kGds || report.cufile_tasks == 0) return std::nullopt;
  const CufileCounts& c = report.cufile;
  if (!c.observable) {
    if (compat_refused_at_open) return std::nullopt;
    return fmt::format(
        "require=gds: cannot prove cuFile used nvidia-fs: its counters are not observable ({}) "
        "and its driver was opened with compatibility mode allowed",
        c.why_not);
  }
  if (c.posix == 0 && c.p2p == 0) return std::nullopt;
  if (c.shared_window) {
    *unjudged = fmt::format(
        "require=gds could not judge this request alone: its window on cuFile's counters ({}) "
        "was shared with other requests, and {} of its {} piece(s) went through cuFile's POSIX "
        "compatibility path or PCI P2PDMA (they may be the other requests')",
        c.gpu_entry >= 0 ? fmt::format("GPU {}'s entry", c.gpu_entry) : "every GPU's, summed",
        c.posix + c.p2p, c.nvfs + c.posix + c.p2p);
    return std::nullopt;
  }
  std::string text = fmt::format(
      "require=gds refuses cuFile's non-nvidia-fs paths: of {} piece(s), cuFile served {} through "
      "its POSIX compatibility path and {} through PCI P2PDMA",
      c.nvfs + c.posix + c.p2p, c.posix, c.p2p);
  if (!c.compat_why.empty()) text += fmt::format(" ({})", c.compat_why);
  if (c.shared_window) text += "; counted over a window shared with other requests";
  return text;
}

}  // namespace ferry::core
