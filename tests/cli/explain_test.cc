// ferry explain: its layer-1 prediction matches what `ferry read` reports on this machine, and
// its facts come from captured trees (--root): udev present and missing, PIX and SYS, tmpfs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <set>

#include "cli/cli_run.h"
#include "platform/fake_tree.h"
#include "test_util.h"

namespace ferry::test {
namespace {

using platform::testing::FakeTree;

std::set<std::string> codes(const nlohmann::json& layer1) {
  std::set<std::string> out;
  for (const auto& r : layer1["reasons"])
    if (r["code"] != "engine") out.insert(r["code"].get<std::string>());
  return out;
}

// The fields docs/cli.md says are comparable: tasks per path and the non-engine reason codes.
void expect_prediction_matches_read(const std::string& file, const std::string& flags) {
  auto e = run_cli_json("explain " + file + " " + flags);
  auto r = run_cli_json("read " + file + " " + flags);
  const auto& p = e["layer1"];
  const auto& got = r["route"]["layer1"];
  EXPECT_EQ(p["posix_tasks"], got["posix_tasks"]) << flags;
  EXPECT_EQ(p["cufile_tasks"], got["cufile_tasks"]) << flags;
  EXPECT_EQ(p["tasks"], r["route"]["tasks"]) << flags;
  EXPECT_EQ(codes(p), codes(got)) << flags << "\n" << e.dump(2);
  EXPECT_EQ(e["size"], r["bytes"]) << flags;
}

TEST(CliExplain, PredictionMatchesTheReadOnThisMachine) {
  TempDir dir;
  write_file(dir / "f.bin", random_bytes(3 << 20, 61));
  const std::string f = (dir / "f.bin").string();
  for (const char* flags :
       {"--host", "--host --task-size 256KiB", "--host --compat on", "--host --size 8KiB",
        "--host --offset 1MiB --size 1MiB", "--host --direct", "", "--size 4KiB"})
    expect_prediction_matches_read(f, flags);
}

TEST(CliExplain, SaysWhatItSeesInWords) {
  TempDir dir;
  write_file(dir / "f.bin", random_bytes(1 << 20, 62));
  CliRun r = run_cli("explain " + (dir / "f.bin").string() + " --host");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* label : {"explain: ", "mount", "fs ", "O_DIRECT", "udev", "nvidia-fs", "iommu",
                            "cuFile", "layer 1 (ferry)", "layer 2 (cuFile)"})
    EXPECT_TRUE(has(r.out, label)) << label << "\n" << r.out;
  auto j = run_cli_json("explain " + (dir / "f.bin").string() + " --host");
  EXPECT_EQ(j["layer2"]["path"], "none");
  EXPECT_EQ(j["layer2"]["expected"]["nvfs"], 0);
  EXPECT_TRUE(j["failure"].is_null());
  EXPECT_TRUE(j["platform"].contains("storage"));
}

TEST(CliExplain, GpuWithoutDriverSaysTheReadWouldFail) {
  if (run_cli_json("check")["cuda"]["available"] == true) GTEST_SKIP() << "a CUDA driver is here";
  TempDir dir;
  write_file(dir / "f.bin", random_bytes(1 << 20, 63));
  CliRun r = run_cli("explain " + (dir / "f.bin").string() + " --gpu 0");
  EXPECT_TRUE(has(r.out, "explain: the read would fail: no CUDA driver")) << r.out;
  CliRun read = run_cli("read " + (dir / "f.bin").string() + " --gpu 0");
  EXPECT_NE(read.status, 0) << "explain predicted a failure: " << read.out;
  // The read's status, after the whole report (docs/cli.md): explain gates a script's read.
  EXPECT_EQ(r.status, read.status) << r.out;
}

TEST(CliExplain, FileOnDevShmIsTmpfs) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  TempDir dir("/dev/shm");
  write_file(dir / "f.bin", random_bytes(1 << 20, 64));
  auto j = run_cli_json("explain " + (dir / "f.bin").string());
  EXPECT_EQ(j["platform"]["storage"]["fs_type"], "tmpfs");
  EXPECT_EQ(j["fs_support"].get<std::string>().rfind("tmpfs: no nvidia-fs support", 0), 0u);
  bool tmpfs_blocks = false;
  for (const auto& b : j["layer2"]["blocking"])
    tmpfs_blocks = tmpfs_blocks || has(b.get<std::string>(), "tmpfs");
  EXPECT_TRUE(tmpfs_blocks) << j["layer2"].dump(2);
  expect_prediction_matches_read((dir / "f.bin").string(), "");
}

TEST(CliExplain, MissingFileIsOneLineAndNonZero) {
  CliRun r = run_cli("explain /nonexistent/ferry.bin");
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(r.out.rfind("ferry: ", 0), 0u) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;
}

// A server captured as a tree: the temp file's real device placed as an NVMe partition, GPU and
// NVMe behind one switch (PIX) or on different sockets (SYS), nvidia-fs loaded, IOMMU off.
class CliExplainOnServer : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(dir_ / "f.bin", random_bytes(1 << 20, 65));
    struct stat st {};
    ASSERT_EQ(::stat((dir_ / "f.bin").c_str(), &st), 0);
    dev_ = std::to_string(::major(st.st_dev)) + ":" + std::to_string(::minor(st.st_dev));
    t_.write("proc/cmdline", "quiet\n");
    t_.mkdir("sys/class/iommu");
    t_.mkdir("sys/kernel/iommu_groups");
    t_.write("proc/self/mountinfo",
             "27 1 " + dev_ + " / / rw,relatime - ext4 /dev/nvme0n1p1 rw,data=ordered\n");
    const std::string nvfs = platform_data() + "/nvfs_rw_on";
    std::filesystem::copy(nvfs, t_.root(), std::filesystem::copy_options::recursive);
    const std::string sw = "pci0000:17/0000:17:00.0/0000:18:00.0";
    t_.pci("pci0000:17/0000:17:00.0", "0x8086", "0x060400", 0);
    t_.pci(sw, "0x1000", "0x060400", 0);
    t_.pci(sw + "/0000:19:00.0", "0x1000", "0x060400", 0);
    t_.pci(sw + "/0000:19:00.0/0000:1a:00.0", "0x10de", "0x030200", 0);
    t_.pci(sw + "/0000:19:04.0", "0x1000", "0x060400", 0);
    t_.pci(sw + "/0000:19:04.0/0000:1b:00.0", "0x144d", "0x010802", 0);
    t_.pci("pci0000:d7/0000:d7:00.0", "0x8086", "0x060400", 1);
    t_.pci("pci0000:d7/0000:d7:00.0/0000:d8:00.0", "0x144d", "0x010802", 1);
  }
  nlohmann::json explain() {
    return run_cli_json("explain " + (dir_ / "f.bin").string() + " --root " + t_.root().string());
  }
  bool anonymous() const { return dev_.rfind("0:", 0) == 0; }
  TempDir dir_;
  FakeTree t_;
  std::string dev_;
};

TEST_F(CliExplainOnServer, UdevPresentAndGpuBehindTheSameSwitch) {
  if (anonymous()) GTEST_SKIP() << "temp dir is on an anonymous device " << dev_;
  t_.block(
      "pci0000:17/0000:17:00.0/0000:18:00.0/0000:19:04.0/0000:1b:00.0/nvme/nvme0/nvme0n1/"
      "nvme0n1p1",
      dev_);
  t_.write("run/udev/data/b" + dev_, "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n");
  auto j = explain();
  EXPECT_EQ(j["platform"]["storage"]["udev_fs_usage"], true);
  EXPECT_EQ(j["platform"]["storage"]["gpu_distances"][0]["distance"], "PIX");
  EXPECT_EQ(j["fs_support"], "ext4 in ordered data mode: supported by nvidia-fs");
  EXPECT_TRUE(j["layer2"]["blocking"].empty()) << j["layer2"].dump(2);
}

TEST_F(CliExplainOnServer, UdevMissingIsError5027AndSysAcrossSockets) {
  if (anonymous()) GTEST_SKIP() << "temp dir is on an anonymous device " << dev_;
  t_.block("pci0000:d7/0000:d7:00.0/0000:d8:00.0/nvme/nvme1/nvme1n1/nvme1n1p1", dev_);
  auto j = explain();
  EXPECT_EQ(j["platform"]["storage"]["udev_fs_usage"], false);
  EXPECT_EQ(j["platform"]["storage"]["gpu_distances"][0]["distance"], "SYS");
  ASSERT_EQ(j["layer2"]["blocking"].size(), 1u) << j["layer2"].dump(2);
  EXPECT_TRUE(has(j["layer2"]["blocking"][0].get<std::string>(), "5027"));
  CliRun r = run_cli("explain " + (dir_ / "f.bin").string() + " --root " + t_.root().string());
  EXPECT_TRUE(has(r.out, "blocks nvidia-fs: udev, device " + dev_)) << r.out;
}

TEST_F(CliExplainOnServer, WritebackExt4AndIommuOnBlockNvidiaFs) {
  if (anonymous()) GTEST_SKIP() << "temp dir is on an anonymous device " << dev_;
  t_.write("proc/self/mountinfo",
           "27 1 " + dev_ + " / / rw - ext4 /dev/nvme0n1p1 rw,data=writeback\n");
  t_.mkdir("sys/class/iommu/dmar0");
  auto j = explain();
  std::string all = j["layer2"]["blocking"].dump();
  EXPECT_TRUE(has(all, "data=writeback")) << all;
  EXPECT_TRUE(has(all, "IOMMU is on")) << all;
}

// The layer-2 blockers are judged once (ferry::layer2_facts): check's verdict names the machine's
// first blocker in explain's own words.
TEST_F(CliExplainOnServer, CheckNamesTheBlockerExplainFinds) {
  t_.mkdir("sys/class/iommu/dmar0");
  const nlohmann::json j = explain();
  std::string iommu;
  for (const auto& b : j["layer2"]["blocking"])
    if (has(b.get<std::string>(), "IOMMU is on")) iommu = b.get<std::string>();
  ASSERT_FALSE(iommu.empty());
  CliRun r = run_cli("check --path " + dir_.path().string() + " --root " + t_.root().string());
  EXPECT_TRUE(has(r.out, "GDS accelerated path: not available (" + iommu + ")")) << r.out;
}

}  // namespace
}  // namespace ferry::test
