// ferry plan reproduces the article's figures and device.md's measurements with the stock
// cufile.json (4 threads, max_request_parallelism 4, min_io_threshold_size_kb 8192).
#include <gtest/gtest.h>

#include <fstream>

#include "cli/cli_run.h"
#include "test_util.h"

namespace ferry::test {
namespace {

std::string stock() { return " --cufile-json " + platform_data() + "/cufile/stock.json"; }
// A read that goes to cuFile whatever this machine has: GPU memory (the test double of libcuda)
// and compat_mode=off, so that cuFile's pieces are planned. Without them `plan` says what the
// read would do here: ferry's POSIX path (CliAgreement checks that).
std::string cufile() { return " --compat off" + stock(); }

TEST(CliPlan, ArticleFiguresInWords) {
  CliRun r = run_cli("plan --size 1GiB --task-size 4MiB" + cufile(), fake_gpu_env());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "plan: 256 cuFile request(s); 256 x 4 MiB: 1 piece of 4 MiB")) << r.out;
  EXPECT_TRUE(has(r.out, "256 piece(s) in all")) << r.out;

  r = run_cli("plan --size 1GiB --task-size 1GiB" + cufile(), fake_gpu_env());
  EXPECT_TRUE(has(r.out, "plan: 1 cuFile request(s); 1 x 1 GiB: 4 pieces of 256 MiB")) << r.out;

  r = run_cli("plan --size 16MiB --task-size 16MiB" + cufile(), fake_gpu_env());
  EXPECT_TRUE(has(r.out, "1 x 16 MiB: 2 pieces of 8 MiB")) << r.out;

  r = run_cli("plan --size 32MiB --task-size 32MiB" + cufile(), fake_gpu_env());
  EXPECT_TRUE(has(r.out, "1 x 32 MiB: 4 pieces of 8 MiB")) << r.out;

  // The engine's rule asks the memory before the threshold: a GPU read (the libcuda double).
  r = run_cli("plan --size 8KiB" + stock(), fake_gpu_env());
  EXPECT_TRUE(has(r.out,
                  "plan: 1 POSIX read of 8 KiB, below gds_threshold 16 KiB: cuFile is "
                  "not called"))
      << r.out;
}

TEST(CliPlan, ArticleFiguresInJson) {
  auto j = run_cli_json("plan --size 1GiB --task-size 4MiB --threads 4" + cufile(), fake_gpu_env());
  EXPECT_EQ(j["path"], "cufile");
  EXPECT_EQ(j["tasks"], 256);
  EXPECT_EQ(j["cufile_requests"], 256);
  EXPECT_EQ(j["cufile_pieces_total"], 256);
  EXPECT_EQ(j["groups"][0]["pieces"]["count"], 1);
  EXPECT_EQ(j["request"]["threads"], 4);
  EXPECT_EQ(j["cufile"]["max_request_parallelism"], 4);
  EXPECT_EQ(j["cufile"]["min_io_threshold_size_kb"], 8192);

  j = run_cli_json("plan --size 1GiB --task-size 1GiB" + cufile(), fake_gpu_env());
  EXPECT_EQ(j["tasks"], 1);
  EXPECT_EQ(j["groups"][0]["pieces"]["count"], 4);
  EXPECT_EQ(j["groups"][0]["pieces"]["first_size"], 256 << 20);
  EXPECT_EQ(j["cufile_pieces_total"], 4);

  j = run_cli_json("plan --size 16MiB --task-size 16MiB" + cufile(), fake_gpu_env());
  EXPECT_EQ(j["groups"][0]["pieces"]["count"], 2);
  EXPECT_EQ(j["groups"][0]["pieces"]["first_size"], 8 << 20);

  j = run_cli_json("plan --size 32MiB --task-size 32MiB" + cufile(), fake_gpu_env());
  EXPECT_EQ(j["groups"][0]["pieces"]["count"], 4);

  j = run_cli_json("plan --size 8KiB" + stock(), fake_gpu_env());
  EXPECT_EQ(j["path"], "posix-below-threshold");
  EXPECT_EQ(j["cufile_requests"], 0);
  EXPECT_EQ(j["cufile_pieces_total"], 0);
  EXPECT_TRUE(j["groups"][0]["pieces"].is_null());
}

// Regression (issue 46): under compat_mode=off, plan predicted 16 cuFile requests for a 64 MiB
// host read that read and explain send down ferry's POSIX path.
TEST(CliPlan, HostReadUnderCompatOffIsPosixNotCufileRequests) {
  auto j = run_cli_json("plan --size 64MiB --host --compat off" + stock());
  EXPECT_EQ(j["path"], "posix") << j.dump(2);
  EXPECT_EQ(j["cufile_requests"], 0) << j.dump(2);
  EXPECT_EQ(j["tasks"], 16) << j.dump(2);
}

TEST(CliPlan, CompatOnNeverCallsCufile) {
  auto j = run_cli_json("plan --size 1GiB --compat on" + stock());
  EXPECT_EQ(j["path"], "posix-compat-on");
  EXPECT_EQ(j["tasks"], 256);
  EXPECT_EQ(j["cufile_requests"], 0);
}

TEST(CliPlan, SettingsComeFromTheEnvironmentByDefault) {
  auto j = run_cli_json("plan --size 1GiB" + cufile(), fake_gpu_env() + " FERRY_TASK_SIZE=1GiB");
  EXPECT_EQ(j["tasks"], 1);
  EXPECT_EQ(j["cufile_pieces_total"], 4);
}

TEST(CliPlan, ParallelIoFalseIsUnknownNotGuessed) {
  TempDir dir;
  std::ofstream(dir / "cufile.json") << R"({"execution": {"parallel_io": false}})";
  auto j = run_cli_json("plan --size 1GiB --task-size 1GiB --compat off --cufile-json " +
                            (dir / "cufile.json").string(),
                        fake_gpu_env());
  EXPECT_EQ(j["groups"][0]["pieces"]["known"], false);
  EXPECT_TRUE(j["cufile_pieces_total"].is_null());
  CliRun r = run_cli("plan --size 1GiB --task-size 1GiB --compat off --cufile-json " +
                         (dir / "cufile.json").string(),
                     fake_gpu_env());
  EXPECT_TRUE(has(r.out, "cuFile's pieces unknown")) << r.out;
}

TEST(CliPlan, BadSizeIsOneLineAndNonZero) {
  CliRun r = run_cli("plan --size 12XB");
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(r.out.rfind("ferry: invalid --size", 0), 0u) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;
  r = run_cli("plan --size 1GiB --cufile-json /nonexistent/cufile.json");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(has(r.out, "no such file")) << r.out;
}

}  // namespace
}  // namespace ferry::test
