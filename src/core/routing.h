// Layer 1: ferry's own choice, per request, between cuFile and its POSIX path, with the reason
// in words. A pure function of the settings, the buffer, the size and the facts asked, which
// core/request_plan.h gathers at the depth its caller needs. Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ferry/memory.h"
#include "ferry/route.h"
#include "ferry/settings.h"

namespace ferry::core {

// In auto mode, a range at least this resident in the page cache is read through it: ferry's
// POSIX path copies cached pages at memory speed, where cuFile's accelerated path would read
// the disk (bench/NOTES.md §10).
constexpr double kPageCacheFirst = 0.10;

// The rules of layer 1, in the one order ferry has (docs/data-paths.md), each asking at most one
// fact, cheapest first. core::plan_route (core/request_plan.h) walks them at every depth and puts
// the rule that decided in words; the small path stops where a rule needs more than the cheap
// facts.
enum class Layer1Rule : std::uint8_t {
  kRemoteSource,       // a remote object: POSIX (ranged GETs; cuFile reads local files only)
  kCompatModeOn,       // compat_mode=on: POSIX
  kHostMemory,         // a host buffer (or no CUDA driver): POSIX
  kBelowThreshold,     // auto mode, below gds_threshold: POSIX
  kCompatOnly,         // by speed: cuFile could only use its compatibility path: POSIX
  kPageCacheResident,  // by speed: the range is in the page cache: POSIX
  kCufileUnavailable,  // the probe failed: POSIX (a refusal under compat_mode=off)
  kCufile,             // cuFile
};

// What a walk asks of the facts: each returns nullopt when the caller cannot tell cheaply (the
// walk then stops, undecided, at that rule).
struct Layer1Asks {
  // Whether the file is a remote object; known to every caller.
  virtual bool remote() { return false; }
  // nullopt: cannot tell; then nullopt inside: cuFile could accelerate; else why not.
  virtual std::optional<std::optional<std::string>> compat_only() = 0;
  // nullopt: cannot tell; else whether at least kPageCacheFirst of the range is cached.
  virtual std::optional<bool> resident() = 0;
  // nullopt: cannot tell; then nullopt inside: cuFile is usable; else why not.
  virtual std::optional<std::optional<std::string>> probe() = 0;

 protected:
  ~Layer1Asks() = default;
};

struct Layer1Walk {
  Layer1Rule rule = Layer1Rule::kCufile;  // the rule that decided, or the one that could not
  bool decided = false;
  std::string why;  // compat_only's or the probe's words, where those decided
};

Layer1Walk walk_layer1(const Settings& settings, bool gpu_memory, std::size_t size,
                       Layer1Asks& asks);

// Where the settings make cuFile a requirement, in words ("compat_mode=off", "require=gds"):
// a fallback to ferry's POSIX path is then a refusal. Empty where auto mode may fall back.
std::string cufile_required_by(const Settings& settings);

// Strict mode at layer 2: under require=gds, a request cuFile served with any non-nvfs piece
// fails, and so does one whose layer 2 cannot be read unless cuFile's compatibility mode was
// refused when its driver opened. Returns the error text, or nullopt when the request stands.
// A window shared with other requests never fails a request after its I/O: the non-nvfs pieces
// may be theirs; *unjudged (report.cufile.unjudged) then says so.
std::optional<std::string> refuse_layer2(const Settings& settings, const RouteReport& report,
                                         bool compat_refused_at_open, std::string* unjudged);

}  // namespace ferry::core
