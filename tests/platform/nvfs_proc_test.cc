#include "platform/nvfs_proc.h"

#include <gtest/gtest.h>

#include "platform/fake_tree.h"
#include "platform/text_file.h"
#include "test_data.h"

namespace ferry::platform {
namespace {

TEST(NvfsProc, ReadsEverythingWithRwStatsOn) {
  auto s = read_nvfs(test::test_data("platform") / "nvfs_rw_on");
  ASSERT_TRUE(s.loaded);
  EXPECT_TRUE(s.problems.empty()) << s.reason;
  EXPECT_EQ(s.version, "2.28");
  EXPECT_EQ(s.devcount, 2u);
  ASSERT_TRUE(s.modules);
  EXPECT_EQ(s.modules->count("nvme"), 1u);
  EXPECT_EQ(s.modules->at("nvme"), "2.28");
  ASSERT_TRUE(s.acs_bridges);
  EXPECT_EQ(*s.acs_bridges, std::vector<std::string>{"0000:3a:00.0"});
  EXPECT_EQ(s.rw_stats_enabled, true);
  ASSERT_TRUE(s.stats);
  EXPECT_EQ(s.stats->driver_version, "2.28.4");
  EXPECT_EQ(s.stats->stats_version, "4.0");
  EXPECT_EQ(s.stats->io_stats_enabled, true);
  EXPECT_EQ(s.stats->peer_io_stats_enabled, false);
  ASSERT_TRUE(s.stats->reads);
  EXPECT_EQ(s.stats->reads->n, 256u);
  EXPECT_EQ(s.stats->reads->ok, 256u);
  EXPECT_EQ(s.stats->reads->mib, 1024u);
  ASSERT_TRUE(s.stats->writes);
  EXPECT_EQ(s.stats->writes->n, 4u);
  EXPECT_EQ(s.stats->writes->mib, 16u);
}

TEST(NvfsProc, BothReadsLinesAreKeptAndTheCountsComeFromTheFirst) {
  auto text =
      read_text_file(test::test_data("platform") / "nvfs_rw_on/proc/driver/nvidia-fs/stats").text;
  auto s = parse_nvfs_stats(text);
  int reads = 0;
  for (const auto& l : s.lines)
    if (l.label == "Reads") ++reads;
  EXPECT_EQ(reads, 2);
  EXPECT_EQ(s.reads->n, 256u);
}

TEST(NvfsProc, PerGpuLinesParseBusIdUuidAndMiB) {
  auto text =
      read_text_file(test::test_data("platform") / "nvfs_rw_on/proc/driver/nvidia-fs/stats").text;
  auto s = parse_nvfs_stats(text);
  ASSERT_EQ(s.gpus.size(), 2u);
  EXPECT_EQ(s.gpus[0].bus_id, "0000:3b:00.0");
  EXPECT_EQ(s.gpus[0].uuid, "4c2f9a1e-77d0-4b1c-9e0a-2f5b8c6d1a90");
  EXPECT_EQ(s.gpus[0].cache_mib, 64u);
  EXPECT_EQ(s.gpus[0].cross_root_port_pct, 0.0);
  EXPECT_EQ(s.gpus[1].registered_mib, 1024u);
  EXPECT_FALSE(s.gpus[1].cross_root_port_pct);
}

TEST(NvfsProc, RwStatsOffPrintsNoCounts) {
  auto s = read_nvfs(test::test_data("platform") / "nvfs_rw_off");
  ASSERT_TRUE(s.loaded);
  EXPECT_EQ(s.rw_stats_enabled, false);
  ASSERT_TRUE(s.stats);
  EXPECT_FALSE(s.stats->reads);
  EXPECT_FALSE(s.stats->writes);
  EXPECT_EQ(s.stats->read_err, 0u);
  EXPECT_EQ(s.stats->io_stats_enabled, false);
  ASSERT_TRUE(s.acs_bridges);
  EXPECT_TRUE(s.acs_bridges->empty());
}

TEST(NvfsProc, ModuleAbsentIsNotLoadedWithReason) {
  auto s = read_nvfs(test::test_data("platform") / "nvfs_absent");
  EXPECT_FALSE(s.loaded);
  EXPECT_NE(s.reason.find("not loaded"), std::string::npos);
}

TEST(NvfsProc, TokensAreFoundWhateverTheirOrderAndSpacing) {
  auto s =
      parse_nvfs_stats("Reads :  ok=7   n=9 readMiB=3 err=1\nWrites: err=2 n=1 ok=1 writeMiB=0\n");
  ASSERT_TRUE(s.reads);
  EXPECT_EQ(s.reads->n, 9u);
  EXPECT_EQ(s.reads->ok, 7u);
  EXPECT_EQ(s.reads->err, 1u);
  EXPECT_EQ(s.writes->err, 2u);
}

TEST(NvfsProc, DeltaCountsReadsBetweenSnapshots) {
  auto before = read_nvfs(test::test_data("platform") / "nvfs_rw_on");
  auto after = before;
  after.stats->reads->n += 256;
  after.stats->reads->ok += 256;
  after.stats->reads->mib += 1024;
  auto d = delta(after, before);
  ASSERT_TRUE(d.known) << d.reason;
  EXPECT_EQ(d.reads.n, 256u);
  EXPECT_EQ(d.reads.mib, 1024u);
  EXPECT_EQ(d.writes.n, 0u);
}

TEST(NvfsProc, DeltaIsUnknownWithRwStatsOff) {
  auto s = read_nvfs(test::test_data("platform") / "nvfs_rw_off");
  auto d = delta(s, s);
  EXPECT_FALSE(d.known);
  EXPECT_NE(d.reason.find("rw_stats_enabled=0"), std::string::npos);
}

TEST(NvfsProc, DeltaIsUnknownWithoutTheModule) {
  auto s = read_nvfs(test::test_data("platform") / "nvfs_absent");
  EXPECT_FALSE(delta(s, s).known);
}

TEST(NvfsProc, DeltaIsUnknownWhenCountersWereReset) {
  auto before = read_nvfs(test::test_data("platform") / "nvfs_rw_on");
  auto after = before;
  after.stats->reads->n = 3;
  auto d = delta(after, before);
  EXPECT_FALSE(d.known);
  EXPECT_NE(d.reason.find("reset"), std::string::npos);
}

TEST(NvfsProc, VersionAndModulesParse) {
  EXPECT_EQ(parse_nvfs_version("version: 2.17\n"), "2.17");
  auto m = parse_nvfs_modules("nvme: 2.28\nlnet: 2.28\n\n");
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(m.at("lnet"), "2.28");
}

}  // namespace
}  // namespace ferry::platform
