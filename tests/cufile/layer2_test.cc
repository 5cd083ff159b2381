// Layer 2: the statistics layouts, the version gate, overlapping windows and the nvidia-fs
// module witness.
#include <gtest/gtest.h>

#include <thread>

#include "cufile/cufile_abi.h"
#include "cufile/cufile_stats.h"
#include "fake_cufile_env.h"
#include "ferry/cufile.h"

namespace ferry {
namespace {

using test::DataFile;
using test::kMiB;

template <typename Level3>
void check_sum(cufile::StatsLayout layout) {
  auto l3 = std::make_unique<Level3>();
  std::memset(l3.get(), 0, sizeof(Level3));
  l3->num_gpus = 2;
  l3->per_gpu_stats[0].n_posix_reads = 5;
  l3->per_gpu_stats[1].n_posix_reads = 7;
  l3->per_gpu_stats[1].n_nvfs_reads = 3;
  l3->per_gpu_stats[0].n_p2p_writes = 2;
  l3->per_gpu_stats[2].n_posix_reads = 1000;  // beyond num_gpus: not counted
  std::memcpy(l3->per_gpu_stats[0].uuid, "0123456789abcdef", 16);
  std::memcpy(l3->per_gpu_stats[1].uuid, "fedcba9876543210", 16);
  std::memcpy(l3->per_gpu_stats[2].uuid, "beyond-num-gpus!", 16);
  cufile::StatsSnapshot s = cufile::sum_per_gpu(l3.get(), layout);
  EXPECT_EQ(s.reads.posix, 12u);
  EXPECT_EQ(s.reads.nvfs, 3u);
  EXPECT_EQ(s.writes.p2p, 2u);
  // Each GPU's own entry, found by its UUID.
  ASSERT_EQ(s.gpus.size(), 2u);
  auto uuid = [](const char* text) {
    std::array<char, 16> u{};
    std::memcpy(u.data(), text, 16);
    return u;
  };
  const cufile::GpuPieceCounters* second = s.find(uuid("fedcba9876543210"));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->reads.posix, 7u);
  EXPECT_EQ(second->reads.nvfs, 3u);
  EXPECT_EQ(s.find(uuid("0123456789abcdef"))->writes.p2p, 2u);
  EXPECT_EQ(s.find(uuid("beyond-num-gpus!")), nullptr);
}

TEST(CufileLayer2, SumsPerGpuCountersInBothLayouts) {
  check_sum<cufile::abi::StatsLevel3V1>(cufile::StatsLayout::kV1);
  check_sum<cufile::abi::StatsLevel3V2>(cufile::StatsLayout::kV2);
}

TEST(CufileLayer2, LayoutIsChosenByVersion) {
  EXPECT_EQ(cufile::stats_layout(1150), cufile::StatsLayout::kV1);
  EXPECT_EQ(cufile::stats_layout(1180), cufile::StatsLayout::kV1);
  EXPECT_EQ(cufile::stats_layout(1190), cufile::StatsLayout::kV2);
  EXPECT_EQ(cufile::stats_layout(1130), cufile::StatsLayout::kUnknown);
  EXPECT_EQ(cufile::stats_layout(1200), cufile::StatsLayout::kUnknown);
  EXPECT_EQ(cufile::version_text(1150), "1.15");
}

TEST(CufileLayer2, NewerLayoutIsReadFromThe13_4Library) {
  setenv("FERRY_FAKE_CUFILE_VERSION", "1190", 1);
  test::use_fake_cufile();
  DataFile f(32 * kMiB);
  std::vector<unsigned char> buf(32 * kMiB);
  File file(f.path(), "r", {false, test::with(32 * kMiB), test::fake_gpu_runtime()});
  file.read(buf.data(), buf.size());
  RouteReport r = file.last_route();
  ASSERT_TRUE(r.cufile.observable) << r.cufile.why_not;
  EXPECT_EQ(r.cufile.posix, 4u);
  EXPECT_EQ(r.cufile.version, 1190);
  unsetenv("FERRY_FAKE_CUFILE_VERSION");
}

TEST(CufileLayer2, UnknownVersionIsNotReadAndSaysSo) {
  setenv("FERRY_FAKE_CUFILE_VERSION", "2050", 1);
  test::use_fake_cufile();
  DataFile f(8 * kMiB);
  std::vector<unsigned char> buf(8 * kMiB);
  File file(f.path(), "r", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
  file.read(buf.data(), buf.size());
  EXPECT_EQ(buf, f.data());
  RouteReport r = file.last_route();
  EXPECT_EQ(r.cufile_tasks, 2u);
  EXPECT_FALSE(r.cufile.observable);
  EXPECT_EQ(r.cufile.why_not,
            "cuFile 2.5 (2050): its statistics layout is unknown to this build of ferry (known: "
            "1.14 to 1.19); not read");
  EXPECT_EQ(r.verdict(),
            "2 request(s) went to cuFile; what cuFile did is not observable: " + r.cufile.why_not);
  EXPECT_FALSE(cufile_status(false).stats_layout_known);
  unsetenv("FERRY_FAKE_CUFILE_VERSION");
}

TEST(CufileLayer2, OverlappingRequestsReportASharedWindow) {
  setenv("FERRY_FAKE_CUFILE_DELAY_US", "20000", 1);
  test::use_fake_cufile();
  DataFile f(16 * kMiB);
  std::vector<unsigned char> a(16 * kMiB), b(16 * kMiB);
  SettingsOverride s = test::with(4 * kMiB);
  s.nthreads = 1;
  File fa(f.path(), "r", {false, s, test::fake_gpu_runtime()});
  File fb(f.path(), "r", {false, s, test::fake_gpu_runtime()});
  IoFuture first = fa.pread(a.data(), a.size());
  IoFuture second = fb.pread(b.data(), b.size());  // begins while the first one runs
  first.get();
  second.get();
  RouteReport ra = first.route(), rb = second.route();
  EXPECT_TRUE(ra.cufile.shared_window);
  EXPECT_TRUE(rb.cufile.shared_window);
  // Each saw (at least) its own pieces; together the window holds all of them.
  EXPECT_GE(ra.cufile.posix, 4u);
  EXPECT_GE(rb.cufile.posix, 4u);
  EXPECT_NE(ra.verdict().find("window shared with other requests"), std::string::npos);
  EXPECT_EQ(a, f.data());
  EXPECT_EQ(b, f.data());
  unsetenv("FERRY_FAKE_CUFILE_DELAY_US");
}

TEST(CufileLayer2, SequentialRequestsHaveExactWindows) {
  test::use_fake_cufile();
  DataFile f(16 * kMiB);
  std::vector<unsigned char> buf(16 * kMiB);
  File file(f.path(), "r", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
  for (int i = 0; i < 3; ++i) {
    file.read(buf.data(), buf.size());
    EXPECT_FALSE(file.last_route().cufile.shared_window);
    EXPECT_EQ(file.last_route().cufile.posix, 4u);
  }
}

TEST(CufileLayer2, NvidiaFsWitnessIsReadWhereTheModuleIsLoaded) {
  test::use_fake_cufile();
  test::FakeMachine::get().set_root(test::test_data() / "platform/nvfs_rw_on");
  DataFile f(8 * kMiB);
  std::vector<unsigned char> buf(8 * kMiB);
  File file(f.path(), "r", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
  file.read(buf.data(), buf.size());
  RouteReport r = file.last_route();
  EXPECT_TRUE(r.cufile.module_observable) << r.cufile.module_why_not;
  EXPECT_EQ(r.cufile.module_ops, 0u) << "a captured file does not move";
  // With the module loaded, cuFile's compatibility path has another cause.
  EXPECT_NE(r.cufile.compat_why.find("cuFile chose it"), std::string::npos) << r.cufile.compat_why;
}

TEST(CufileLayer2, NvidiaFsWitnessNeedsRwStats) {
  test::use_fake_cufile();
  test::FakeMachine::get().set_root(test::test_data() / "platform/nvfs_rw_off");
  DataFile f(8 * kMiB);
  std::vector<unsigned char> buf(8 * kMiB);
  File file(f.path(), "r", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
  file.read(buf.data(), buf.size());
  RouteReport r = file.last_route();
  EXPECT_FALSE(r.cufile.module_observable);
  EXPECT_NE(r.cufile.module_why_not.find("rw_stats"), std::string::npos) << r.cufile.module_why_not;
}

}  // namespace
}  // namespace ferry
