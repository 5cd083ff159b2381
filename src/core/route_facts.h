// The facts layer 1 decides on, gathered the same way for a read (core::submit) and for its
// prediction (ferry::explain), so the two cannot disagree: cuFile's outlook from cheap facts,
// the range's page-cache residency (measured by the caller, which also reports it), and the
// cuFile probe, each asked only when decide_route needs it (through core/paths.h, so core does
// not know cuFile). Not thread-safe: one per decision.
#pragma once

#include "core/open_file.h"
#include "core/paths.h"
#include "core/routing.h"
#include "ferry/settings.h"

namespace ferry::core {

// `probe` receives the accelerated path's probe when decide_route asks for it; it and `file`
// must outlive the returned facts.
RouteFacts gather_route_facts(OpenFile& file, const Settings& settings,
                              const PageCacheResidency& residency, AcceleratedProbe* probe);

// Layer 1 of a request on [offset, offset + span) of `file` (`size`: the bytes it moves; span,
// the bytes a read's residency is measured over), as core::submit runs it and ferry::explain
// predicts it: the residency measured (reads only), the facts gathered, the decision.
struct Layer1Plan {
  PageCacheResidency residency;
  RouteDecision route;
  // Where the File asked for O_DIRECT and its file system refused it: the reason to add.
  std::optional<RouteReason> direct_refused;
};
Layer1Plan plan_layer1(OpenFile& file, Op op, const Settings& settings,
                       const MemoryInfo& route_memory, std::uint64_t offset, std::uint64_t span,
                       std::size_t size, AcceleratedProbe* probe);

}  // namespace ferry::core
