#include "core/route_facts.h"

#include "cufile/cufile_outlook.h"

namespace ferry::core {

RouteFacts gather_route_facts(OpenFile& file, const Settings& settings,
                              const PageCacheResidency& residency, cufile::Probe* probe) {
  RouteFacts facts;
  facts.compat_only = [&file]() -> std::optional<std::string> {
    cufile::Outlook outlook = cufile::accelerated_outlook(file.fd());
    if (outlook.accelerated) return std::nullopt;
    return outlook.why_not;
  };
  facts.residency = residency;
  facts.probe_cufile = [&file, settings, probe]() -> std::optional<std::string> {
    *probe = cufile::probe(file, settings);
    if (probe->state) return std::nullopt;
    return probe->why_not;
  };
  return facts;
}

}  // namespace ferry::core
