// Test-only helper (in the style of LevelDB's EnvPosixTestHelper): the plan of a request whose
// facts the test gives, as if cuFile's accelerated path were possible and the range cold, for
// tests of the availability rules. Not in src/: production code asks real facts.
#pragma once

#include <optional>
#include <string>

#include "core/request_plan.h"

namespace ferry::core::test {

// `cufile_unavailable`: nullopt when cuFile's probe succeeds, else why it fails.
inline RequestPlan plan_with_probe(const Settings& settings, const MemoryInfo& memory,
                                   std::size_t size,
                                   const std::optional<std::string>& cufile_unavailable) {
  struct Given final : Layer1Asks {
    explicit Given(const std::optional<std::string>& p) : probed(p) {}
    std::optional<std::optional<std::string>> compat_only() override {
      return std::optional<std::string>();
    }
    std::optional<bool> resident() override { return false; }
    std::optional<std::optional<std::string>> probe() override { return probed; }
    const std::optional<std::string>& probed;
  } asks(cufile_unavailable);
  return plan_route(settings, memory, size, asks, PageCacheResidency{});
}

}  // namespace ferry::core::test
