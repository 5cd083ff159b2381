#include "platform/iommu.h"

#include <gtest/gtest.h>

#include "platform/fake_tree.h"
#include "platform/p2pdma.h"
#include "test_data.h"

namespace ferry::platform {
namespace {

using testing::FakeTree;

TEST(Iommu, UnitsInSysClassIommuMeanOn) {
  FakeTree t;
  t.mkdir("sys/class/iommu/dmar0");
  t.mkdir("sys/class/iommu/dmar1");
  t.mkdir("sys/kernel/iommu_groups/0");
  t.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz intel_iommu=on quiet\n");
  auto s = read_iommu(t.root());
  EXPECT_EQ(s.enabled, true);
  EXPECT_EQ(s.units, (std::vector<std::string>{"dmar0", "dmar1"}));
  EXPECT_EQ(s.groups, 1u);
  EXPECT_NE(s.how.find("intel_iommu=on"), std::string::npos) << s.how;
  EXPECT_FALSE(s.passthrough);
}

TEST(Iommu, PassthroughIsOnButSaysHostDmaIsNotTranslated) {
  FakeTree t;
  t.mkdir("sys/class/iommu/ivhd0");
  t.write("proc/cmdline", "amd_iommu=on iommu=pt\n");
  auto s = read_iommu(t.root());
  EXPECT_EQ(s.enabled, true);
  EXPECT_TRUE(s.passthrough);
  EXPECT_NE(s.how.find("passthrough"), std::string::npos);
}

TEST(Iommu, EmptySysfsDirectoriesMeanOff) {
  // As on the GPU machine (2026-11-30): both directories exist and are empty.
  FakeTree t;
  t.write("sys/class/iommu/.gitkeep", "");
  t.mkdir("sys/kernel/iommu_groups");
  t.write("proc/cmdline", "console=ttyS0 quiet -- intel_iommu=on\n");
  auto s = read_iommu(t.root());
  EXPECT_EQ(s.enabled, false);
  EXPECT_NE(s.how.find("no IOMMU argument"), std::string::npos) << "init args after -- ignored";
}

TEST(Iommu, CommandLineDecidesWhenSysfsIsSilent) {
  FakeTree t;
  t.write("proc/cmdline", "intel_iommu=off\n");
  EXPECT_EQ(read_iommu(t.root()).enabled, false);
}

TEST(Iommu, NothingShownIsUnknown) {
  FakeTree t;
  auto s = read_iommu(t.root());
  EXPECT_FALSE(s.enabled);
  EXPECT_NE(s.how.find("unknown"), std::string::npos);
}

TEST(Iommu, KernelArgumentsParse) {
  auto a = parse_kernel_iommu_args("ro iommu.passthrough=1 amd_iommu=off");
  EXPECT_EQ(a.amd_iommu, "off");
  EXPECT_EQ(a.iommu_passthrough, "1");
  EXPECT_FALSE(a.intel_iommu);
}

TEST(Acs, ComesFromNvidiaFsBridges) {
  auto on = acs_from_nvfs(read_nvfs(test::test_data("platform") / "nvfs_rw_on"));
  EXPECT_EQ(on.any_enabled, true);
  EXPECT_EQ(on.bridges, std::vector<std::string>{"0000:3a:00.0"});
  auto off = acs_from_nvfs(read_nvfs(test::test_data("platform") / "nvfs_rw_off"));
  EXPECT_EQ(off.any_enabled, false);
  auto unknown = acs_from_nvfs(read_nvfs(test::test_data("platform") / "nvfs_absent"));
  EXPECT_FALSE(unknown.any_enabled);
  EXPECT_NE(unknown.how.find("not loaded"), std::string::npos);
}

TEST(P2pdma, DevicesPublishingP2pmemAreListed) {
  FakeTree t;
  t.pci("pci0000:00/0000:00:01.0/0000:01:00.0");
  t.mkdir("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/p2pmem");
  auto s = read_p2pdma(t.root());
  EXPECT_EQ(s.available, true);
  EXPECT_EQ(s.p2pmem_devices, std::vector<std::string>{"0000:01:00.0"});
}

TEST(P2pdma, NothingShownIsUnknown) {
  FakeTree t;
  t.pci("pci0000:00/0000:00:06.0", "0x10de", "0x030200");
  auto s = read_p2pdma(t.root());
  EXPECT_FALSE(s.available);
  EXPECT_NE(s.how.find("unknown"), std::string::npos);
}

TEST(P2pdma, KernelConfigWithoutP2pdmaMeansOff) {
  FakeTree t;
  t.write("proc/sys/kernel/osrelease", "6.1.0-test\n");
  t.write("boot/config-6.1.0-test", "CONFIG_PCI=y\n# CONFIG_PCI_P2PDMA is not set\n");
  auto s = read_p2pdma(t.root());
  EXPECT_EQ(s.available, false);
  EXPECT_EQ(s.kernel_config, false);
  EXPECT_EQ(parse_kernel_config_p2pdma("CONFIG_PCI_P2PDMA=y\n"), true);
}

}  // namespace
}  // namespace ferry::platform
