#include "core/routing.h"

#include <fmt/format.h>

#include <tuple>
#include <utility>

namespace ferry::core {

namespace {

// The rule that decided (true) or the one that could not (false); `why` gets compat_only's or
// the probe's words where those decided. Apart from the Layer1Walk, which is returned once and
// never copied: a copy per rule was a third of a small request's walk (bench/NOTES.md).
std::pair<Layer1Rule, bool> walk(const Settings& settings, bool gpu_memory, std::size_t size,
                                 Layer1Asks& asks, std::string& why) {
  if (asks.remote()) return {Layer1Rule::kRemoteSource, true};
  if (settings.compat_mode == CompatMode::kOn) return {Layer1Rule::kCompatModeOn, true};
  // cuFile is only worth calling for GPU memory; host buffers are read straight in.
  if (!gpu_memory) return {Layer1Rule::kHostMemory, true};
  const bool automatic = settings.compat_mode == CompatMode::kAuto;
  if (automatic && size < settings.gds_threshold) return {Layer1Rule::kBelowThreshold, true};
  // The speed rules apply in auto mode without strict mode: compat_mode=off and require=cufile
  // or gds are the user's ways to insist on cuFile.
  if (automatic && settings.require == Require::kAny) {
    std::optional<std::optional<std::string>> compat = asks.compat_only();
    if (!compat) return {Layer1Rule::kCompatOnly, false};
    if (*compat) {
      why = std::move(**compat);
      return {Layer1Rule::kCompatOnly, true};
    }
    std::optional<bool> resident = asks.resident();
    if (!resident) return {Layer1Rule::kPageCacheResident, false};
    if (*resident) return {Layer1Rule::kPageCacheResident, true};
  }
  std::optional<std::optional<std::string>> probe = asks.probe();
  if (!probe) return {Layer1Rule::kCufileUnavailable, false};
  if (*probe) {
    why = std::move(**probe);
    return {Layer1Rule::kCufileUnavailable, true};
  }
  return {Layer1Rule::kCufile, true};
}

}  // namespace

Layer1Walk walk_layer1(const Settings& settings, bool gpu_memory, std::size_t size,
                       Layer1Asks& asks) {
  Layer1Walk w;
  std::tie(w.rule, w.decided) = walk(settings, gpu_memory, size, asks, w.why);
  return w;
}

std::string cufile_required_by(const Settings& settings) {
  if (settings.compat_mode == CompatMode::kOff) return "compat_mode=off";
  return settings.require == Require::kAny ? "" : "require=" + to_string(settings.require);
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
