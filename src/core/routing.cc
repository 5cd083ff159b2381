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

Layer1Walk walk_layer1(const Settings& settings, bool gpu_memory, std::size_t size,
                       Layer1Asks& asks) {
  Layer1Walk w;
  auto stop = [&w](Layer1Rule rule, bool decided) {
    w.rule = rule;
    w.decided = decided;
    return w;
  };
  if (asks.remote()) return stop(Layer1Rule::kRemoteSource, true);
  if (settings.compat_mode == CompatMode::kOn) return stop(Layer1Rule::kCompatModeOn, true);
  // cuFile is only worth calling for GPU memory; host buffers are read straight in.
  if (!gpu_memory) return stop(Layer1Rule::kHostMemory, true);
  const bool automatic = settings.compat_mode == CompatMode::kAuto;
  if (automatic && size < settings.gds_threshold) return stop(Layer1Rule::kBelowThreshold, true);
  // The speed rules apply in auto mode without strict mode: compat_mode=off and require=cufile
  // or gds are the user's ways to insist on cuFile.
  if (automatic && settings.require == Require::kAny) {
    std::optional<std::optional<std::string>> compat = asks.compat_only();
    if (!compat) return stop(Layer1Rule::kCompatOnly, false);
    if (*compat) {
      w.why = std::move(**compat);
      return stop(Layer1Rule::kCompatOnly, true);
    }
    std::optional<bool> resident = asks.resident();
    if (!resident) return stop(Layer1Rule::kPageCacheResident, false);
    if (*resident) return stop(Layer1Rule::kPageCacheResident, true);
  }
  std::optional<std::optional<std::string>> probe = asks.probe();
  if (!probe) return stop(Layer1Rule::kCufileUnavailable, false);
  if (*probe) {
    w.why = std::move(**probe);
    return stop(Layer1Rule::kCufileUnavailable, true);
  }
  return stop(Layer1Rule::kCufile, true);
}

namespace {

// Every fact known or asked for: the walk always decides.
struct AllFacts final : Layer1Asks {
  explicit AllFacts(const RouteFacts& f) : facts(f) {}
  bool remote() override { return facts.remote; }
  std::optional<std::optional<std::string>> compat_only() override { return facts.compat_only(); }
  std::optional<bool> resident() override {
    return facts.residency.known && facts.residency.fraction() >= kPageCacheFirst;
  }
  std::optional<std::optional<std::string>> probe() override { return facts.probe_cufile(); }
  const RouteFacts& facts;
};

}  // namespace

RouteDecision decide_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                           const RouteFacts& facts) {
  AllFacts asks(facts);
  Layer1Walk w = walk_layer1(settings, is_gpu(memory.kind), size, asks);
  RouteDecision d;
  auto posix = [&](ReasonCode code, std::string text) {
    d.path = Path::kPosix;
    d.reasons.push_back({code, std::move(text)});
  };
  switch (w.rule) {
    case Layer1Rule::kRemoteSource:
      posix(ReasonCode::kRemoteSource,
            fmt::format("a remote object: its bytes come by HTTP GETs into {}; cuFile reads "
                        "local files only",
                        is_gpu(memory.kind) ? "pinned staging, copied to the GPU" : "the buffer"));
      if (settings.compat_mode == CompatMode::kOff && is_gpu(memory.kind)) {
        d.refusal = fmt::format(
            "compat_mode=off requires cuFile, which cannot read a remote "
            "object: {}",
            d.reasons.back().text);
      }
      break;
    case Layer1Rule::kCompatModeOn:
      posix(ReasonCode::kCompatModeOn, "compat_mode=on: cuFile is never called");
      break;
    case Layer1Rule::kHostMemory: {
      std::string text = fmt::format("{} buffer: cuFile serves GPU memory", to_string(memory.kind));
      if (!memory.note.empty()) text += fmt::format(" ({})", memory.note);
      posix(memory.note.empty() ? ReasonCode::kHostBuffer : ReasonCode::kNoCudaDriver, text);
      break;
    }
    case Layer1Rule::kBelowThreshold:
      posix(ReasonCode::kBelowThreshold,
            fmt::format("request {} B below gds_threshold {} B", size, settings.gds_threshold));
      break;
    case Layer1Rule::kCompatOnly:
      // Measured on the GPU machine: cuFile's compatibility path reads with O_DIRECT at the
      // disk's 1.5 GB/s where ferry's POSIX path reads cached data at 52 GB/s (bench/NOTES.md §6).
      posix(ReasonCode::kCufileCompatOnly,
            fmt::format("cuFile could only use its POSIX compatibility path ({}), which is slower "
                        "than ferry's POSIX path; compat_mode=off forces cuFile",
                        w.why));
      break;
    case Layer1Rule::kPageCacheResident:
      posix(ReasonCode::kPageCacheResident,
            fmt::format("the range is in the page cache ({}): ferry's POSIX path copies it from "
                        "memory, where cuFile's accelerated path would read the disk",
                        describe(facts.residency)));
      break;
    case Layer1Rule::kCufileUnavailable:
      posix(ReasonCode::kCufileUnavailable, w.why);
      if (settings.compat_mode == CompatMode::kOff) {
        d.refusal = fmt::format("compat_mode=off requires cuFile, which is unavailable: {}", w.why);
      }
      break;
    case Layer1Rule::kCufile:
      d.path = Path::kCufile;
      break;
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
