#include "core/route_facts.h"

namespace ferry::core {

RouteFacts gather_route_facts(OpenFile& file, const Settings& settings,
                              const PageCacheResidency& residency, AcceleratedProbe* probe) {
  RouteFacts facts;
  facts.compat_only = [&file]() { return accelerated_path().compat_only(file.fd()); };
  facts.residency = residency;
  facts.probe_cufile = [&file, settings, probe]() -> std::optional<std::string> {
    *probe = accelerated_path().probe(file, settings);
    if (probe->backend) return std::nullopt;
    return probe->why_not;
  };
  return facts;
}

}  // namespace ferry::core
