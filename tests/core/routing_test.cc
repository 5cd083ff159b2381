#include "core/routing.h"

#include <gtest/gtest.h>

namespace ferry::core {
namespace {

MemoryInfo gpu() { return MemoryInfo{MemoryKind::kDevice, 0, ""}; }
MemoryInfo host() { return MemoryInfo{MemoryKind::kHostPageable, -1, ""}; }
const std::optional<std::string> kUsable;
const std::optional<std::string> kMissing = std::string("libcufile.so.0 not found");

TEST(Routing, AutoSendsLargeGpuRequestsToCufile) {
  RouteDecision d = decide_route(Settings{}, gpu(), 4 << 20, kUsable);
  EXPECT_EQ(d.path, Path::kCufile);
  EXPECT_FALSE(d.refusal);
}

TEST(Routing, CompatOnNeverCallsCufile) {
  Settings s;
  s.compat_mode = CompatMode::kOn;
  RouteDecision d = decide_route(s, gpu(), 4 << 20, kUsable);
  EXPECT_EQ(d.path, Path::kPosix);
  EXPECT_EQ(d.reasons.at(0).code, ReasonCode::kCompatModeOn);
}

TEST(Routing, ReadBelowThresholdTakesPosixWithSizesInTheReason) {
  RouteDecision d = decide_route(Settings{}, gpu(), 8192, kUsable);
  EXPECT_EQ(d.path, Path::kPosix);
  EXPECT_EQ(d.reasons.at(0).code, ReasonCode::kBelowThreshold);
  EXPECT_EQ(d.reasons.at(0).text, "request 8192 B below gds_threshold 16384 B");
}

TEST(Routing, HostBufferTakesPosix) {
  RouteDecision d = decide_route(Settings{}, host(), 4 << 20, kUsable);
  EXPECT_EQ(d.path, Path::kPosix);
  EXPECT_EQ(d.reasons.at(0).code, ReasonCode::kHostBuffer);
}

TEST(Routing, AutoFallsBackWithTheReasonWhenCufileIsMissing) {
  RouteDecision d = decide_route(Settings{}, gpu(), 4 << 20, kMissing);
  EXPECT_EQ(d.path, Path::kPosix);
  EXPECT_EQ(d.reasons.at(0).code, ReasonCode::kCufileUnavailable);
  EXPECT_EQ(d.reasons.at(0).text, *kMissing);
  EXPECT_FALSE(d.refusal);
}

TEST(Routing, CompatOffRefusesToFallBack) {
  Settings s;
  s.compat_mode = CompatMode::kOff;
  RouteDecision d = decide_route(s, gpu(), 4 << 20, kMissing);
  ASSERT_TRUE(d.refusal);
  EXPECT_NE(d.refusal->find("libcufile.so.0 not found"), std::string::npos);
}

TEST(Routing, RequireCufileRefusesThePosixPath) {
  Settings s;
  s.require = Require::kCufile;
  EXPECT_TRUE(decide_route(s, gpu(), 8192, kUsable).refusal);
  EXPECT_FALSE(decide_route(s, gpu(), 4 << 20, kUsable).refusal);
}

}  // namespace
}  // namespace ferry::core
