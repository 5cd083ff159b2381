#include "core/routing.h"

#include <gtest/gtest.h>

#include "core/plan_helper.h"

namespace ferry::core {
namespace {

MemoryInfo gpu() { return MemoryInfo{MemoryKind::kDevice, 0, ""}; }
MemoryInfo host() { return MemoryInfo{MemoryKind::kHostPageable, -1, ""}; }
const std::optional<std::string> kUsable;
const std::optional<std::string> kMissing = std::string("libcufile.so.0 not found");

TEST(Routing, AutoSendsLargeGpuRequestsToCufile) {
  RequestPlan d = test::plan_with_probe(Settings{}, gpu(), 4 << 20, kUsable);
  EXPECT_EQ(d.path, Path::kCufile);
  EXPECT_FALSE(d.refusal);
}

TEST(Routing, CompatOnNeverCallsCufile) {
  Settings s;
  s.compat_mode = CompatMode::kOn;
  RequestPlan d = test::plan_with_probe(s, gpu(), 4 << 20, kUsable);
  EXPECT_EQ(d.path, Path::kPosix);
  EXPECT_EQ(d.reasons.at(0).code, ReasonCode::kCompatModeOn);
}

TEST(Routing, ReadBelowThresholdTakesPosixWithSizesInTheReason) {
  RequestPlan d = test::plan_with_probe(Settings{}, gpu(), 8192, kUsable);
  EXPECT_EQ(d.path, Path::kPosix);
  EXPECT_EQ(d.reasons.at(0).code, ReasonCode::kBelowThreshold);
  EXPECT_EQ(d.reasons.at(0).text, "request 8192 B below gds_threshold 16384 B");
}

TEST(Routing, HostBufferTakesPosix) {
  RequestPlan d = test::plan_with_probe(Settings{}, host(), 4 << 20, kUsable);
  EXPECT_EQ(d.path, Path::kPosix);
  EXPECT_EQ(d.reasons.at(0).code, ReasonCode::kHostBuffer);
}

TEST(Routing, AutoFallsBackWithTheReasonWhenCufileIsMissing) {
  RequestPlan d = test::plan_with_probe(Settings{}, gpu(), 4 << 20, kMissing);
  EXPECT_EQ(d.path, Path::kPosix);
  EXPECT_EQ(d.reasons.at(0).code, ReasonCode::kCufileUnavailable);
  EXPECT_EQ(d.reasons.at(0).text, *kMissing);
  EXPECT_FALSE(d.refusal);
}

TEST(Routing, CompatOffRefusesToFallBack) {
  Settings s;
  s.compat_mode = CompatMode::kOff;
  RequestPlan d = test::plan_with_probe(s, gpu(), 4 << 20, kMissing);
  ASSERT_TRUE(d.refusal);
  EXPECT_NE(d.refusal->find("libcufile.so.0 not found"), std::string::npos);
}

TEST(Routing, RequireCufileRefusesThePosixPath) {
  Settings s;
  s.require = Require::kCufile;
  EXPECT_TRUE(test::plan_with_probe(s, gpu(), 8192, kUsable).refusal);
  EXPECT_FALSE(test::plan_with_probe(s, gpu(), 4 << 20, kUsable).refusal);
}

// Issue 32: one rule order. A walk asks each fact only when its rule is reached, in order, and
// stops undecided where the caller cannot tell (the small path has no residency, no probe).
struct ScriptedAsks final : Layer1Asks {
  std::optional<std::optional<std::string>> compat;
  std::optional<bool> cached;
  std::optional<std::optional<std::string>> probed;
  std::string asked;
  std::optional<std::optional<std::string>> compat_only() override {
    asked += "compat ";
    return compat;
  }
  std::optional<bool> resident() override {
    asked += "residency ";
    return cached;
  }
  std::optional<std::optional<std::string>> probe() override {
    asked += "probe ";
    return probed;
  }
};

TEST(Routing, OneWalkAsksTheFactsInOrderAndStopsWhereTheCallerCannotTell) {
  ScriptedAsks cheap;  // what the small path knows: cuFile's outlook, nothing more
  cheap.compat = std::optional<std::string>();
  Layer1Walk w = walk_layer1(Settings{}, true, 4 << 20, cheap);
  EXPECT_FALSE(w.decided);
  EXPECT_EQ(w.rule, Layer1Rule::kPageCacheResident);
  EXPECT_EQ(cheap.asked, "compat residency ");

  ScriptedAsks host;
  w = walk_layer1(Settings{}, false, 4 << 20, host);
  EXPECT_TRUE(w.decided);
  EXPECT_EQ(w.rule, Layer1Rule::kHostMemory);
  EXPECT_EQ(host.asked, "") << "a host buffer asks nothing";

  ScriptedAsks compat_only;
  compat_only.compat = std::optional<std::string>("nvidia-fs is not loaded");
  w = walk_layer1(Settings{}, true, 4 << 20, compat_only);
  EXPECT_TRUE(w.decided);
  EXPECT_EQ(w.rule, Layer1Rule::kCompatOnly);
  EXPECT_EQ(w.why, "nvidia-fs is not loaded");

  ScriptedAsks all;  // what a request knows: every fact
  all.compat = std::optional<std::string>();
  all.cached = false;
  all.probed = std::optional<std::string>();
  w = walk_layer1(Settings{}, true, 4 << 20, all);
  EXPECT_TRUE(w.decided);
  EXPECT_EQ(w.rule, Layer1Rule::kCufile);
  EXPECT_EQ(all.asked, "compat residency probe ");

  // compat_mode=off skips the speed rules: straight to the probe, which the small path lacks.
  Settings off;
  off.compat_mode = CompatMode::kOff;
  ScriptedAsks strict;
  w = walk_layer1(off, true, 4 << 20, strict);
  EXPECT_FALSE(w.decided);
  EXPECT_EQ(w.rule, Layer1Rule::kCufileUnavailable);
  EXPECT_EQ(strict.asked, "probe ");
}

}  // namespace
}  // namespace ferry::core
