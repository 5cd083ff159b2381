#include "core/request_plan.h"

#include <fmt/format.h>

#include "core/runtime_state.h"

namespace ferry::core {
namespace {

// What the walk asks at each depth (Layer1Asks). Cheap: a File's cheap facts, never the
// residency or the probe.
struct CheapAsks : Layer1Asks {
  explicit CheapAsks(OpenFile& f) : file(f) {}
  bool remote() override { return file.remote(); }
  std::optional<std::optional<std::string>> compat_only() override {
    return file.runtime().env().accelerated->compat_only(file.fd());
  }
  std::optional<bool> resident() override { return std::nullopt; }
  std::optional<std::optional<std::string>> probe() override { return std::nullopt; }
  OpenFile& file;
};

// Full (a request, explain): all the facts of a File, asked at most once each.
struct FileAsks final : CheapAsks {
  FileAsks(OpenFile& f, const Settings& s, const PageCacheResidency& r, AcceleratedProbe& p)
      : CheapAsks(f), settings(s), residency(r), probed(p) {}
  std::optional<bool> resident() override {
    return residency.known && residency.fraction() >= kPageCacheFirst;
  }
  std::optional<std::optional<std::string>> probe() override {
    probed = file.runtime().env().accelerated->probe(file, settings);
    if (probed.backend) return std::optional<std::string>();
    return probed.why_not;
  }
  const Settings& settings;
  const PageCacheResidency& residency;
  AcceleratedProbe& probed;
};

// Predict over a file not yet named (plan, check): local, cold, the environment's cuFile outlook,
// the probe as the caller says.
struct HypotheticalAsks final : Layer1Asks {
  HypotheticalAsks(const Environment& e, const std::optional<std::optional<std::string>>& p)
      : env(e), answer(p) {}
  std::optional<std::optional<std::string>> compat_only() override {
    return env.accelerated->compat_only(-1);
  }
  std::optional<bool> resident() override { return false; }
  std::optional<std::optional<std::string>> probe() override { return answer; }
  const Environment& env;
  const std::optional<std::optional<std::string>>& answer;
};

}  // namespace

ReasonCode reason_code(Layer1Rule rule, bool no_driver) {
  // In Layer1Rule's order; kCufile has no reason (a code is asked of POSIX rules only).
  constexpr ReasonCode kCodes[] = {ReasonCode::kRemoteSource,      ReasonCode::kCompatModeOn,
                                   ReasonCode::kHostBuffer,        ReasonCode::kBelowThreshold,
                                   ReasonCode::kCufileCompatOnly,  ReasonCode::kPageCacheResident,
                                   ReasonCode::kCufileUnavailable, ReasonCode::kCufileUnavailable};
  if (rule == Layer1Rule::kHostMemory && no_driver) return ReasonCode::kNoCudaDriver;
  return kCodes[static_cast<std::size_t>(rule)];
}

namespace {

// The rule in words: the reason, and the refusal where the
// settings forbid ferry's POSIX path.
std::string words_of(const RequestPlan& p, const Settings& settings, const MemoryInfo& memory,
                     std::size_t size, const PageCacheResidency& residency) {
  switch (p.walk.rule) {
    case Layer1Rule::kRemoteSource:
      return fmt::format(
          "a remote object: its bytes come by HTTP GETs into {}; cuFile reads local files only",
          is_gpu(memory.kind) ? "pinned staging, copied to the GPU" : "the buffer");
    case Layer1Rule::kCompatModeOn:
      return "compat_mode=on: cuFile is never called";
    case Layer1Rule::kHostMemory: {
      std::string text = fmt::format("{} buffer: cuFile serves GPU memory", to_string(memory.kind));
      if (!memory.note.empty()) text += fmt::format(" ({})", memory.note);
      return text;
    }
    case Layer1Rule::kBelowThreshold:
      return fmt::format("request {} B below gds_threshold {} B", size, settings.gds_threshold);
    case Layer1Rule::kCompatOnly:
      // Measured on the GPU machine: cuFile's compatibility path reads with O_DIRECT at the
      // disk's 1.5 GB/s where ferry's POSIX path reads cached data at 52 GB/s (bench/NOTES.md §6).
      return fmt::format(
          "cuFile could only use its POSIX compatibility path ({}), which is slower than ferry's "
          "POSIX path; compat_mode=off forces cuFile",
          p.walk.why);
    case Layer1Rule::kPageCacheResident:
      return fmt::format(
          "the range is in the page cache ({}): ferry's POSIX path copies it from memory, where "
          "cuFile's accelerated path would read the disk",
          describe(residency));
    case Layer1Rule::kCufileUnavailable:
    case Layer1Rule::kCufile:
      return p.walk.why;
  }
  return {};
}

}  // namespace

RequestPlan plan_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                       Layer1Asks& asks, const PageCacheResidency& residency) {
  RequestPlan p;
  p.walk = walk_layer1(settings, is_gpu(memory.kind), size, asks);
  p.code = reason_code(p.walk.rule, !memory.note.empty());
  // Undecided: a hypothetical file left the probe to the file (cuFile, if it opens for it).
  p.path = p.walk.rule == Layer1Rule::kCufile || !p.walk.decided ? Path::kCufile : Path::kPosix;
  p.cufile_required_by = core::cufile_required_by(settings);
  p.file_decides = !p.walk.decided;
  if (p.path == Path::kCufile) return p;
  p.reasons.push_back({p.code, words_of(p, settings, memory, size, residency)});
  const std::string& text = p.reasons.back().text;
  const bool off = settings.compat_mode == CompatMode::kOff;
  if (p.walk.rule == Layer1Rule::kRemoteSource && off && is_gpu(memory.kind)) {
    p.refusal =
        fmt::format("compat_mode=off requires cuFile, which cannot read a remote object: {}", text);
  } else if (p.walk.rule == Layer1Rule::kCufileUnavailable && off) {
    p.refusal = fmt::format("compat_mode=off requires cuFile, which is unavailable: {}", text);
  } else if (settings.require != Require::kAny) {
    p.refusal =
        fmt::format("require={} refuses ferry's POSIX path: {}", to_string(settings.require), text);
  }
  return p;
}

RequestPlan plan_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                       const PlanSubject& subject) {
  if (subject.file == nullptr) {
    HypotheticalAsks asks(*subject.env, subject.probe);
    PageCacheResidency cold;
    cold.why_not = "no file named: its page cache is not known (taken as cold)";
    RequestPlan p = plan_route(settings, memory, size, asks, cold);
    p.residency = std::move(cold);
    return p;
  }
  OpenFile& file = *subject.file;
  PageCacheResidency residency;
  if (file.remote()) {
    residency.why_not = "a remote object: its bytes are not in this machine's page cache";
  } else if (subject.op == Op::kRead) {
    residency = file.runtime().env().host->residency(file.fd(), subject.offset, subject.span);
  } else {
    residency.why_not = "not measured for writes";
  }
  AcceleratedProbe probe;
  FileAsks asks(file, settings, residency, probe);
  RequestPlan p = plan_route(settings, memory, size, asks, residency);
  p.residency = std::move(residency);
  p.probe = std::move(probe);
  return p;
}

Layer1Walk cheap_walk(const Settings& settings, bool gpu_memory, std::size_t size, OpenFile& file) {
  CheapAsks asks(file);
  return walk_layer1(settings, gpu_memory, size, asks);
}

ChosenMemory choose_memory(const MemoryChoice& r, const CudaStatus& cuda) {
  ChosenMemory c;
  MemoryInfo& m = c.memory;
  if (r.host || r.pinned || (!r.gpu && (!cuda.available || cuda.gpus.empty()))) {
    m.kind = r.pinned ? MemoryKind::kHostPinned : MemoryKind::kHostPageable;
    m.device = r.pinned ? 0 : -1;
    if (!cuda.available) m.note = cuda.why_not;  // what classify_memory says without a driver
    // Without a driver the route's reason names it (no_cuda_driver): said once, there.
    if (!r.host && !r.pinned)
      c.note = "no GPU, using host memory" + (cuda.available ? " (" + cuda.why_not + ")" : "");
    if (r.pinned && !cuda.available) c.failure = cuda.why_not;
  } else {
    m.kind = MemoryKind::kDevice;
    m.device = r.gpu.value_or(0);
    if (!cuda.available) {
      c.failure = cuda.why_not;
    } else if (m.device < 0 || static_cast<std::size_t>(m.device) >= cuda.gpus.size()) {
      c.failure = fmt::format("GPU {} does not exist: the CUDA driver sees {} GPU(s)", m.device,
                              cuda.gpus.size());
    }
  }
  return c;
}

}  // namespace ferry::core
