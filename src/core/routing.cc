#include "core/routing.h"

#include <fmt/format.h>

namespace ferry::core {

RouteDecision decide_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                           const std::optional<std::string>& cufile_unavailable) {
  RouteDecision d;
  auto posix = [&](ReasonCode code, std::string text) {
    d.path = Path::kPosix;
    d.reasons.push_back({code, std::move(text)});
  };
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
  } else if (cufile_unavailable) {
    posix(ReasonCode::kCufileUnavailable, *cufile_unavailable);
    if (settings.compat_mode == CompatMode::kOff) {
      d.refusal = fmt::format("compat_mode=off requires cuFile, which is unavailable: {}",
                              *cufile_unavailable);
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

}  // namespace ferry::core
