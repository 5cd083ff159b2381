#include "core/route_facts.h"

#include "core/runtime_state.h"

namespace ferry::core {

RouteFacts gather_route_facts(OpenFile& file, const Settings& settings,
                              const PageCacheResidency& residency, AcceleratedProbe* probe) {
  RouteFacts facts;
  facts.remote = file.remote();
  const AcceleratedPath& accelerated = *file.runtime().env().accelerated;
  facts.compat_only = [&file, &accelerated]() { return accelerated.compat_only(file.fd()); };
  facts.residency = residency;
  facts.probe_cufile = [&file, &accelerated, settings, probe]() -> std::optional<std::string> {
    *probe = accelerated.probe(file, settings);
    if (probe->backend) return std::nullopt;
    return probe->why_not;
  };
  return facts;
}

Layer1Plan plan_layer1(OpenFile& file, Op op, const Settings& settings,
                       const MemoryInfo& route_memory, std::uint64_t offset, std::uint64_t span,
                       std::size_t size, AcceleratedProbe* probe) {
  Layer1Plan plan;
  if (file.remote()) {
    plan.residency.why_not = "a remote object: its bytes are not in this machine's page cache";
  } else if (op == Op::kRead) {
    plan.residency = file.runtime().env().host->residency(file.fd(), offset, span);
  } else {
    plan.residency.why_not = "not measured for writes";
  }
  RouteFacts facts = gather_route_facts(file, settings, plan.residency, probe);
  plan.route = decide_route(settings, route_memory, size, facts);
  if (file.direct_requested() && file.direct_fd() < 0) {
    plan.direct_refused = RouteReason{ReasonCode::kDirectIoRefused, file.direct_refused()};
  }
  return plan;
}

}  // namespace ferry::core
