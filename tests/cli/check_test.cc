// ferry check on captured and built trees (--root), and on this machine as it is.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <fstream>
#include <map>
#include <sstream>

#include "cli/cli_run.h"
#include "platform/fake_tree.h"

namespace ferry::test {
namespace {

using platform::testing::FakeTree;

std::string slurp(const std::string& path) {
  std::ostringstream out;
  out << std::ifstream(path).rdbuf();
  return out.str();
}

// The GPU machine as captured on 2026-11-30: one H200, no nvidia-fs, IOMMU off, stock cufile.json.
void gpu_machine(const FakeTree& t) {
  t.write("proc/cmdline", "console=ttyS0 quiet\n");
  t.write("proc/driver/nvidia/version",
          "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n");
  t.mkdir("sys/class/iommu");
  t.mkdir("sys/kernel/iommu_groups");
  t.pci("pci0000:00/0000:00:06.0", "0x10de", "0x030200", -1);
  t.write("etc/cufile.json", slurp(platform_data() + "/cufile/stock.json"));
}

bool have_cuda() { return run_cli_json("check")["cuda"]["available"] == true; }

TEST(CliCheck, RunsOnThisMachineAndSaysWhatItCannotSee) {
  CliRun r = run_cli("check");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* label : {"nvidia-fs", "cufile.json", "iommu", "acs", "p2pdma", "cuda driver",
                            "libcufile", "ferry task_size", "verdict: "})
    EXPECT_TRUE(has(r.out, label)) << label << "\n" << r.out;
  auto j = run_cli_json("check");
  for (const char* key : {"platform", "cuda", "cufile", "settings", "verdicts"})
    EXPECT_TRUE(j.contains(key)) << key;
  if (j["cuda"]["available"] == false) {
    EXPECT_TRUE(has(r.out, "no driver (")) << r.out;
    EXPECT_FALSE(j["cuda"]["why_not"].get<std::string>().empty());
  }
  if (j["cufile"]["loaded"] == false) {
    EXPECT_TRUE(has(r.out, "libcufile")) << r.out;
  }
}

TEST(CliCheck, GpuMachineWithoutNvidiaFsGivesAVerdictPerGpu) {
  FakeTree t;
  gpu_machine(t);
  CliRun r = run_cli("check --root " + t.root().string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "580.159.04")) << r.out;
  EXPECT_TRUE(has(r.out, "verdict: GPU 0000:00:06.0")) << r.out;
  EXPECT_TRUE(has(r.out, "GDS accelerated path: not available (nvidia-fs is not loaded: "))
      << r.out;
  EXPECT_TRUE(has(r.out, "not " + t.root().string() + "'s")) << "says libcuda is the process's";
  if (!have_cuda()) {
    EXPECT_TRUE(has(r.out, "ferry cannot use GPU memory")) << r.out;
  }
  auto j = run_cli_json("check --root " + t.root().string());
  EXPECT_EQ(j["platform"]["gpus"][0]["bus_id"], "0000:00:06.0");
  EXPECT_EQ(j["platform"]["iommu"]["on"], false);
  EXPECT_EQ(j["platform"]["cufile_json"]["state"], "loaded");
  EXPECT_EQ(j["verdicts"].size(), 1u);
  EXPECT_FALSE(j["process_note"].get<std::string>().empty());
}

TEST(CliCheck, MissingUdevEntryIsInTheVerdict) {
  FakeTree t;
  gpu_machine(t);
  struct stat st {};
  ASSERT_EQ(::stat(t.root().c_str(), &st), 0);
  const std::string dev =
      std::to_string(::major(st.st_dev)) + ":" + std::to_string(::minor(st.st_dev));
  if (dev.rfind("0:", 0) == 0) GTEST_SKIP() << "temp dir is on an anonymous device " << dev;
  t.write("proc/self/mountinfo", "27 1 " + dev + " / / rw - ext4 /dev/vda rw\n");
  const std::string args = "check --root " + t.root().string() + " --path " + t.root().string();
  CliRun r = run_cli(args);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "cannot be registered with cuFile")) << r.out;
  EXPECT_TRUE(has(r.out, "5027")) << r.out;
  t.write("run/udev/data/b" + dev, "E:ID_FS_USAGE=filesystem\n");
  auto j = run_cli_json(args);
  EXPECT_EQ(j["platform"]["storage"]["udev_fs_usage"], true);
  EXPECT_FALSE(has(j["verdicts"][0].get<std::string>(), "cannot be registered"));
}

TEST(CliCheck, NvidiaFsPresent) {
  CliRun r = run_cli("check --root " + platform_data() + "/nvfs_rw_on");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "loaded, version 2.28")) << r.out;
  EXPECT_TRUE(has(r.out, "nvme registered")) << r.out;
  auto j = run_cli_json("check --root " + platform_data() + "/nvfs_rw_on");
  EXPECT_EQ(j["platform"]["nvidia_fs"]["loaded"], true);
  EXPECT_EQ(j["platform"]["nvidia_fs"]["rw_stats_enabled"], true);
  EXPECT_EQ(j["platform"]["acs"]["on"], true);
}

TEST(CliCheck, NvidiaFsAbsent) {
  CliRun r = run_cli("check --root " + platform_data() + "/nvfs_absent");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "not loaded")) << r.out;
  EXPECT_EQ(run_cli_json("check --root " + platform_data() +
                         "/nvfs_absent")["platform"]["nvidia_fs"]["loaded"],
            false);
}

TEST(CliCheck, BadCufileJsonShowsLineAndColumn) {
  FakeTree t;
  gpu_machine(t);
  t.write("etc/cufile.json", slurp(platform_data() + "/cufile/bad_syntax.json"));
  CliRun r = run_cli("check --root " + t.root().string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "does not parse at line 5, column 9")) << r.out;
  EXPECT_TRUE(has(r.out, "execution.parallel_io               unknown")) << r.out;
  auto j = run_cli_json("check --root " + t.root().string());
  EXPECT_EQ(j["platform"]["cufile_json"]["state"], "malformed");
}

TEST(CliCheck, CufileEnvironmentIsShown) {
  CliRun r = run_cli("check --root " + platform_data(),
                     "CUFILE_ENV_PATH_JSON=/cufile/stock.json CUFILE_FORCE_COMPAT_MODE=true");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "/cufile/stock.json (CUFILE_ENV_PATH_JSON): loaded")) << r.out;
  EXPECT_TRUE(has(r.out, "CUFILE_FORCE_COMPAT_MODE=true")) << r.out;
  EXPECT_TRUE(has(r.out, "properties.force_compat_mode        true (environment)")) << r.out;
}

TEST(CliCheck, SettingsSayWhereTheyCameFrom) {
  CliRun r = run_cli("check", "FERRY_TASK_SIZE=8MiB");
  EXPECT_TRUE(has(r.out, "8 MiB (environment FERRY_TASK_SIZE)")) << r.out;
  EXPECT_TRUE(has(r.out, "ferry compat_mode")) << r.out;
  auto j = run_cli_json("check", "FERRY_TASK_SIZE=8MiB");
  bool found = false;
  for (const auto& s : j["settings"]) {
    if (s["name"] != "task_size") continue;
    found = true;
    EXPECT_EQ(s["source"], "environment");
  }
  EXPECT_TRUE(found);
}

// Regression: where libcufile loads (the H200), check opened cuFile's driver reading the
// settings, and a malformed variable ended check there, before its report. Here on the test
// doubles of libcuda and libcufile.
TEST(CliCheck, MalformedSettingIsReportedWhereCufileLoadsToo) {
  const std::string env =
      fake_gpu_env() + " FERRY_CUFILE_LIBRARY=" FERRY_FAKE_CUFILE_PATH " FERRY_TASK_SIZE=lots";
  CliRun r = run_cli("check", env, /*merge_stderr=*/false);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.out, "verdict: ")) << r.out;
  EXPECT_TRUE(has(r.out, "cuFile will run in compatibility mode")) << r.out;
  EXPECT_TRUE(has(r.out, "FERRY_TASK_SIZE='lots'")) << r.out;
}

// check exists to diagnose a malformed variable: it reports it beside the default left in its
// place and goes on with the whole report (issue 35), then exits non-zero with one line.
TEST(CliCheck, MalformedSettingIsReportedAndTheReportGoesOn) {
  CliRun r = run_cli("check", "FERRY_TASK_SIZE=lots", /*merge_stderr=*/false);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(has(r.out, "verdict: ")) << r.out;
  EXPECT_TRUE(has(r.out, "ferry task_size")) << r.out;
  EXPECT_TRUE(has(r.out, "FERRY_TASK_SIZE='lots'")) << r.out;
  auto j = nlohmann::json::parse(
      run_cli("check --json", "FERRY_TASK_SIZE=lots", /*merge_stderr=*/false).out);
  bool reported = false;
  for (const auto& row : j["settings"]) {
    if (row["name"] == "task_size") reported = has(row["error"].get<std::string>(), "'lots'");
  }
  EXPECT_TRUE(reported) << j["settings"].dump(2);
}

// Issue 46: the remote policy, statistics and library variables were read by hand where they are
// used; a malformed one went unsaid until a remote open, and check listed none of them.
TEST(CliCheck, MalformedRemoteVariableIsReportedAsASettingIs) {
  CliRun r = run_cli("check", "FERRY_REMOTE_RETRIES=lots", /*merge_stderr=*/true);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(has(r.out, "verdict: ")) << r.out;
  EXPECT_TRUE(has(r.out, "ferry remote_retries")) << r.out;
  EXPECT_TRUE(has(r.out,
                  "ferry: check: invalid FERRY_REMOTE_RETRIES='lots': not a whole number; "
                  "expected a whole number from 0 to 100"))
      << r.out;
}

TEST(CliCheck, ListsEveryVariableFerryReads) {
  CliRun r = run_cli("check --json", "FERRY_CURL_LIBRARY=libcurl.so.4 KVIKIO_HTTP_MAX_ATTEMPTS=3",
                     /*merge_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.out;
  std::map<std::string, nlohmann::json> rows;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const auto& row : j["settings"]) rows[row["env"].get<std::string>()] = row;
  for (const char* env :
       {"FERRY_TASK_SIZE", "FERRY_REMOTE_RETRIES", "FERRY_REMOTE_TIMEOUT", "FERRY_REMOTE_DEADLINE",
        "KVIKIO_HTTP_STATUS_CODES", "FERRY_STATS_PUBLISH", "FERRY_STATS_DIR", "FERRY_CUDA_LIBRARY",
        "FERRY_CUFILE_LIBRARY", "FERRY_CURL_LIBRARY", "FERRY_CRYPTO_LIBRARY"})
    EXPECT_TRUE(rows.count(env)) << env << " is not listed";
  EXPECT_EQ(rows["FERRY_CURL_LIBRARY"]["source"], "environment");
  EXPECT_EQ(rows["FERRY_REMOTE_RETRIES"]["value"], "2") << "3 attempts are 2 retries";
  EXPECT_EQ(rows["FERRY_REMOTE_RETRIES"]["source_env"], "KVIKIO_HTTP_MAX_ATTEMPTS");
  EXPECT_EQ(rows["FERRY_STATS_DIR"]["value"], "/dev/shm");
}

}  // namespace
}  // namespace ferry::test
