// Layer 1: ferry's own choice, per request, between cuFile and its POSIX path, with the reason
// in words. A pure function of the settings, the buffer, the size and the facts below, so
// `ferry explain` and the request engine share it. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ferry/memory.h"
#include "ferry/route.h"
#include "ferry/settings.h"

namespace ferry::core {

struct RouteDecision {
  Path path = Path::kPosix;
  std::vector<RouteReason> reasons;
  // Set when the settings forbid the only possible path: the request must fail before I/O.
  std::optional<std::string> refusal;
};

// In auto mode, a range at least this resident in the page cache is read through it: ferry's
// POSIX path copies cached pages at memory speed, where cuFile's accelerated path would read
// the disk (bench/NOTES.md §10).
constexpr double kPageCacheFirst = 0.10;

// What layer 1 may ask, cheapest first. Each callback is called at most once, and only when the
// decision depends on it, so a request that goes to POSIX anyway never opens cuFile's driver.
struct RouteFacts {
  // The file is a remote object (http, https, s3): its bytes come over the network.
  bool remote = false;
  // nullopt when cuFile could serve this file through an accelerated path (nvidia-fs, P2PDMA);
  // else why it could only use its compatibility path. Cheap: no driver open.
  std::function<std::optional<std::string>()> compat_only;
  // Residency of the range in the page cache (unknown counts as cold).
  PageCacheResidency residency;
  // nullopt when cuFile is usable for this file (driver open, handle registered), else why not.
  std::function<std::optional<std::string>()> probe_cufile;
};

// The rules of layer 1, in the one order ferry has (docs/data-paths.md), each asking at most one
// fact, cheapest first. decide_route() puts the rule that decided in words; the small path
// (request.cc) walks the same rules with the cheap facts only and stops where a rule needs more.
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

RouteDecision decide_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                           const RouteFacts& facts);

// The rule without the speed facts (as if cuFile's accelerated path were possible and the range
// cold): for tests of the availability rules.
RouteDecision decide_route(const Settings& settings, const MemoryInfo& memory, std::size_t size,
                           const std::optional<std::string>& cufile_unavailable);

// Strict mode at layer 2: under require=gds, a request cuFile served with any non-nvfs piece
// fails, and so does one whose layer 2 cannot be read unless cuFile's compatibility mode was
// refused when its driver opened. Returns the error text, or nullopt when the request stands.
// A window shared with other requests never fails a request after its I/O: the non-nvfs pieces
// may be theirs; *unjudged (report.cufile.unjudged) then says so.
std::optional<std::string> refuse_layer2(const Settings& settings, const RouteReport& report,
                                         bool compat_refused_at_open, std::string* unjudged);

}  // namespace ferry::core
