// JSON pieces shared by the route report (route.cc) and explain's prediction (explain.cc), so
// both spell a field the same way. Internal; the stable documents are in docs/data-paths.md and
// docs/cli.md.
#pragma once

#include <nlohmann/json.hpp>

#include "ferry/route.h"

namespace ferry::core {

inline nlohmann::json page_cache_json(const PageCacheResidency& p) {
  return {{"known", p.known}, {"why_not", p.why_not},     {"resident", p.resident},
          {"bytes", p.bytes}, {"estimated", p.estimated}, {"method", p.method}};
}

}  // namespace ferry::core
