// The route report's words and JSON, and the process-wide counters, on the test double.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fake_cufile_env.h"
#include "ferry/stats.h"

namespace ferry {
namespace {

using test::DataFile;
using test::kMiB;

RouteReport read_once(const DataFile& f, std::size_t task_size,
                      CompatMode compat = CompatMode::kOff) {
  std::vector<unsigned char> buf(f.data().size());
  File file(f.path(), "r", {false, test::with(task_size, compat), test::fake_gpu_runtime()});
  EXPECT_EQ(file.read(buf.data(), buf.size()), buf.size());
  EXPECT_EQ(buf, f.data());
  return file.last_route();
}

TEST(CufileReport, VerdictSaysCufileServedAllThroughCompatAndWhy) {
  test::use_fake_cufile();
  DataFile f(16 * kMiB);  // 16 tasks of one piece each, as 64 MiB in 4 MiB tasks
  RouteReport r = read_once(f, 1 * kMiB);
  EXPECT_EQ(r.verdict(),
            "16 request(s) went to cuFile; cuFile served all 16 piece(s) through its POSIX "
            "compatibility path: the nvidia-fs module is not loaded");
  std::string text = r.to_text();
  EXPECT_NE(text.find("layer 2 (cuFile): nvfs=0 posix=16 p2p=0"), std::string::npos) << text;
  EXPECT_NE(text.find("nvidia-fs (system-wide): not observable: the nvidia-fs module is not "
                      "loaded"),
            std::string::npos)
      << text;
}

TEST(CufileReport, ForcedCompatModeIsNamed) {
  setenv("FERRY_FAKE_CUFILE_NVFS", "1", 1);
  setenv("CUFILE_FORCE_COMPAT_MODE", "true", 1);
  test::use_fake_cufile();
  DataFile f(16 * kMiB);
  RouteReport r = read_once(f, 4 * kMiB);
  EXPECT_EQ(r.cufile.posix, 4u);
  EXPECT_EQ(r.cufile.compat_why, "CUFILE_FORCE_COMPAT_MODE=true forces it");
  unsetenv("CUFILE_FORCE_COMPAT_MODE");
  unsetenv("FERRY_FAKE_CUFILE_NVFS");
}

TEST(CufileReport, PosixFallbackVerdictGivesTheReason) {
  test::use_fake_gds_machine();
  setenv("FERRY_FAKE_CUFILE_HANDLE_ERROR", "5027", 1);
  DataFile f(8 * kMiB);
  RouteReport r = read_once(f, 4 * kMiB, CompatMode::kAuto);
  unsetenv("FERRY_FAKE_CUFILE_HANDLE_ERROR");
  EXPECT_EQ(r.verdict().rfind("2 task(s) went to ferry's POSIX path, cuFile was not called: "
                              "cuFileHandleRegister failed for ",
                              0),
            0u)
      << r.verdict();
  EXPECT_EQ(r.cufile.why_not, "no request went to cuFile");
}

TEST(CufileReport, JsonCarriesBothLayers) {
  test::use_fake_cufile();
  DataFile f(16 * kMiB);
  RouteReport r = read_once(f, 16 * kMiB);
  auto j = nlohmann::json::parse(r.to_json());
  EXPECT_EQ(j["layer1"]["cufile_tasks"], 1);
  EXPECT_EQ(j["layer2"]["observable"], true);
  EXPECT_EQ(j["layer2"]["posix"], 2);
  EXPECT_EQ(j["layer2"]["nvfs"], 0);
  EXPECT_EQ(j["layer2"]["version"], 1150);
  EXPECT_EQ(j["layer2"]["compat_why"], "the nvidia-fs module is not loaded");
  EXPECT_EQ(j["layer2"]["nvfs_module"]["observable"], false);
  EXPECT_EQ(j["verdict"], r.verdict());
}

TEST(CufileReport, ProcessCountersKeepTheSameTotals) {
  test::use_fake_cufile();
  reset_stats();
  DataFile f(16 * kMiB);
  RouteReport a = read_once(f, 4 * kMiB);
  RouteReport b = read_once(f, 16 * kMiB);
  Stats s = stats();
  EXPECT_EQ(s.requests, 2u);
  EXPECT_EQ(s.cufile_tasks, a.cufile_tasks + b.cufile_tasks);
  EXPECT_EQ(s.compat_pieces, a.cufile.posix + b.cufile.posix);
  EXPECT_EQ(s.compat_pieces, 6u);
  EXPECT_EQ(s.nvfs_pieces, 0u);
  EXPECT_EQ(s.shared_windows, 0u);
}

}  // namespace
}  // namespace ferry
