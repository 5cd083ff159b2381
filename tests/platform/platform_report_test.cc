#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <nlohmann/json.hpp>

#include "ferry/platform.h"
#include "platform/fake_tree.h"
#include "platform/text_file.h"
#include "test_data.h"

namespace ferry {
namespace {

using platform::testing::FakeTree;

// The GPU machine as captured on 2026-11-30, with udev switched by the test.
void gpu_machine(const FakeTree& t) {
  t.write("proc/cmdline", "console=ttyS0 quiet pci=realloc=off\n");
  t.write("proc/sys/kernel/osrelease", "6.18.0\n");
  t.write("proc/driver/nvidia/version",
          "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n");
  t.mkdir("sys/class/iommu");
  t.mkdir("sys/kernel/iommu_groups");
  t.pci("pci0000:00/0000:00:06.0", "0x10de", "0x030200", -1);
  t.pci("pci0000:00/0000:00:01.0", "0x1af4", "0x018000", -1);
  t.write("etc/cufile.json",
          platform::read_text_file(test::test_data("platform") / "cufile/stock.json").text);
}

TEST(PlatformReport, GpuMachineWithoutNvidiaFs) {
  FakeTree t;
  gpu_machine(t);
  auto r = read_platform(t.root());
  EXPECT_EQ(r.kernel_release, "6.18.0");
  EXPECT_EQ(r.nvidia_driver_version, "580.159.04");
  ASSERT_EQ(r.gpus.size(), 1u);
  EXPECT_EQ(r.gpus[0].bus_id, "0000:00:06.0");
  EXPECT_FALSE(r.gpus[0].name) << "names come from libcuda, filled elsewhere";
  EXPECT_FALSE(r.nvfs.loaded);
  EXPECT_EQ(r.iommu.on, false);
  EXPECT_FALSE(r.acs.on);
  EXPECT_FALSE(r.p2pdma.on);
  EXPECT_EQ(r.cufile.state, "loaded");
  ASSERT_EQ(r.cufile.values.size(), 9u);
  EXPECT_EQ(r.cufile.values[4].key, "execution.parallel_io");
  EXPECT_EQ(r.cufile.values[4].value, "true");
  EXPECT_EQ(r.cufile.values[4].source, "file");
}

TEST(PlatformReport, WithNvidiaFsRwStatsOn) {
  auto r = read_platform(test::test_data("platform") / "nvfs_rw_on");
  EXPECT_TRUE(r.nvfs.loaded);
  EXPECT_EQ(r.nvfs.nvme_registered, true);
  EXPECT_EQ(r.nvfs.reads_n, 256u);
  EXPECT_EQ(r.acs.on, true);
  EXPECT_EQ(r.cufile.state, "missing");
  EXPECT_FALSE(r.nvidia_driver_version);
  EXPECT_FALSE(r.nvidia_driver_reason.empty());
}

TEST(PlatformReport, JsonIsValidAndUnknownsAreNull) {
  FakeTree t;
  gpu_machine(t);
  auto r = read_platform(t.root());
  auto j = nlohmann::json::parse(platform_report_json(r));
  EXPECT_EQ(j["nvidia_fs"]["loaded"], false);
  EXPECT_TRUE(j["nvidia_fs"]["version"].is_null());
  EXPECT_EQ(j["gpus"][0]["bar1_bytes"], nullptr);
  EXPECT_EQ(j["iommu"]["on"], false);
  EXPECT_FALSE(j.contains("storage"));
  auto text = format_platform_report(r);
  EXPECT_NE(text.find("nvidia-fs"), std::string::npos);
  EXPECT_NE(text.find("not loaded"), std::string::npos);
}

class StorageOnFakeDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    gpu_machine(t_);
    file_ = t_.at("data.bin");
    t_.write("data.bin", "x");
    struct stat st {};
    ASSERT_EQ(::stat(file_.c_str(), &st), 0);
    dev_ = fmt_dev(st);
    // The temp file's real device, placed as a virtio disk next to the GPU.
    t_.write("proc/self/mountinfo",
             "27 1 " + dev_ + " / / rw,relatime - ext4 /dev/vda rw,discard\n");
    t_.block("pci0000:00/0000:00:01.0/virtio0/block/vda", dev_);
  }
  static std::string fmt_dev(const struct stat& st) {
    return std::to_string(::major(st.st_dev)) + ":" + std::to_string(::minor(st.st_dev));
  }
  FakeTree t_;
  std::filesystem::path file_;
  std::string dev_;
};

TEST_F(StorageOnFakeDisk, MissingUdevIsDiagnosed) {
  auto r = read_platform(t_.root());
  auto s = read_storage(file_, r.gpus, t_.root());
  EXPECT_EQ(s.fs_type, "ext4");
  EXPECT_EQ(s.device, dev_);
  if (dev_.rfind("0:", 0) == 0) GTEST_SKIP() << "temp dir is on an anonymous device " << dev_;
  EXPECT_EQ(s.udev_fs_usage, false);
  EXPECT_NE(s.udev_reason.find("/run/udev does not exist"), std::string::npos);
  EXPECT_EQ(s.pci_function, "0000:00:01.0");
  ASSERT_EQ(s.gpu_distances.size(), 1u);
  EXPECT_EQ(s.gpu_distances[0].distance, "PHB");
}

TEST_F(StorageOnFakeDisk, UdevEntryWithIdFsUsageIsReported) {
  t_.write("run/udev/data/b" + dev_, "E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n");
  auto r = read_platform(t_.root());
  auto s = read_storage(file_, r.gpus, t_.root());
  if (dev_.rfind("0:", 0) == 0) GTEST_SKIP() << "temp dir is on an anonymous device " << dev_;
  EXPECT_EQ(s.udev_fs_usage, true);
  auto j = nlohmann::json::parse(platform_report_json(r, s));
  EXPECT_EQ(j["storage"]["udev_fs_usage"], true);
  EXPECT_EQ(j["storage"]["gpu_distances"][0]["distance"], "PHB");
  EXPECT_NE(format_platform_report(r, s).find("PHB"), std::string::npos);
}

TEST(PlatformReport, RealMachineReadsWithoutThrowing) {
  auto r = read_platform("/");
  auto s = read_storage("/proc/self/mountinfo", r.gpus, "/");
  EXPECT_FALSE(format_platform_report(r, s).empty());
  EXPECT_NO_THROW(nlohmann::json::parse(platform_report_json(r, s)));
}

TEST(PlatformReport, EmptyRootIsAllUnknownNotAnError) {
  FakeTree t;
  auto r = read_platform(t.root());
  EXPECT_TRUE(r.gpus.empty());
  EXPECT_FALSE(r.gpus_reason.empty());
  EXPECT_FALSE(r.nvfs.loaded);
  EXPECT_FALSE(r.iommu.on);
  EXPECT_EQ(r.cufile.state, "missing");
}

}  // namespace
}  // namespace ferry
