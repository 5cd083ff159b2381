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

}  // namespace ferry::core
