// ferry stats: nvidia-fs's system-wide counters from captured trees, and its absence said.
#include <gtest/gtest.h>

#include "cli/cli_run.h"

namespace ferry::test {
namespace {

TEST(CliStats, WithoutNvidiaFsSaysSo) {
  CliRun r = run_cli("stats --root " + platform_data() + "/nvfs_absent");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("nvidia-fs not loaded: ", 0), 0u) << r.out;
  EXPECT_TRUE(has(r.out, "route.layer2")) << "points at the per-request counts";
  auto j = run_cli_json("stats --root " + platform_data() + "/nvfs_absent");
  EXPECT_EQ(j["nvidia_fs"]["loaded"], false);
  EXPECT_TRUE(j["nvidia_fs"]["reads"].is_null());
}

TEST(CliStats, RunsOnThisMachine) {
  CliRun r = run_cli("stats");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "nvidia-fs")) << r.out;
}

TEST(CliStats, CountersWithRwStatsOn) {
  CliRun r = run_cli("stats --root " + platform_data() + "/nvfs_rw_on");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "reads   n=256 ok=256 err=0 MiB=1024")) << r.out;
  EXPECT_TRUE(has(r.out, "gpu 0000:86:00.0  registered 1024 MiB")) << r.out;
  auto j = run_cli_json("stats --root " + platform_data() + "/nvfs_rw_on");
  EXPECT_EQ(j["nvidia_fs"]["reads"]["n"], 256);
  EXPECT_EQ(j["nvidia_fs"]["writes"]["mib"], 16);
}

TEST(CliStats, RwStatsOffSaysReadsAreNotCounted) {
  CliRun r = run_cli("stats --root " + platform_data() + "/nvfs_rw_off");
  EXPECT_TRUE(has(r.out, "rw_stats_enabled is 0")) << r.out;
  auto j = run_cli_json("stats --watch 0.05 --root " + platform_data() + "/nvfs_rw_off");
  EXPECT_EQ(j["watch"]["known"], false);
  EXPECT_TRUE(has(j["watch"]["reason"].get<std::string>(), "rw_stats_enabled=0"));
}

TEST(CliStats, WatchGivesTheGrowth) {
  auto j = run_cli_json("stats --watch 0.05 --root " + platform_data() + "/nvfs_rw_on");
  EXPECT_EQ(j["watch"]["known"], true);
  EXPECT_EQ(j["watch"]["reads"]["n"], 0);
}

}  // namespace
}  // namespace ferry::test
