#include "platform/pci_topology.h"

#include <gtest/gtest.h>

#include "platform/fake_tree.h"

namespace ferry::platform {
namespace {

using testing::FakeTree;

constexpr const char* kGpuClass = "0x030200";
constexpr const char* kNvmeClass = "0x010802";

// A two-socket server: a GPU and an NVMe behind one PCIe switch on socket 0, an NVMe on another
// root complex of socket 0, one on socket 1, one behind the same root port's host bridge, and one
// behind a second switch cascaded below the first.
class TwoSocketServer : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string sw = "pci0000:17/0000:17:00.0/0000:18:00.0";
    t_.pci("pci0000:17/0000:17:00.0", "0x8086", "0x060400", 0);
    t_.pci(sw, "0x1000", "0x060400", 0);
    t_.pci(sw + "/0000:19:00.0", "0x1000", "0x060400", 0);
    t_.pci(sw + "/0000:19:00.0/0000:1a:00.0", "0x10de", kGpuClass, 0);
    t_.pci(sw + "/0000:19:04.0", "0x1000", "0x060400", 0);
    t_.pci(sw + "/0000:19:04.0/0000:1b:00.0", "0x144d", kNvmeClass, 0);
    t_.block(sw + "/0000:19:04.0/0000:1b:00.0/nvme/nvme0/nvme0n1", "259:0");
    t_.block(sw + "/0000:19:04.0/0000:1b:00.0/nvme/nvme0/nvme0n1/nvme0n1p1", "259:1");
    t_.pci("pci0000:d7/0000:d7:00.0", "0x8086", "0x060400", 1);
    t_.pci("pci0000:d7/0000:d7:00.0/0000:d8:00.0", "0x144d", kNvmeClass, 1);
    t_.block("pci0000:d7/0000:d7:00.0/0000:d8:00.0/nvme/nvme1/nvme1n1", "259:2");
    t_.pci("pci0000:3a/0000:3a:00.0", "0x8086", "0x060400", 0);
    t_.pci("pci0000:3a/0000:3a:00.0/0000:3b:00.0", "0x144d", kNvmeClass, 0);
    t_.block("pci0000:3a/0000:3a:00.0/0000:3b:00.0/nvme/nvme2/nvme2n1", "259:3");
    t_.pci("pci0000:17/0000:17:02.0", "0x8086", "0x060400", 0);
    t_.pci("pci0000:17/0000:17:02.0/0000:1c:00.0", "0x144d", kNvmeClass, 0);
    t_.block("pci0000:17/0000:17:02.0/0000:1c:00.0/nvme/nvme3/nvme3n1", "259:4");
    const std::string cascade = sw + "/0000:19:08.0/0000:1d:00.0/0000:1e:00.0";
    t_.pci(sw + "/0000:19:08.0", "0x1000", "0x060400", 0);
    t_.pci(sw + "/0000:19:08.0/0000:1d:00.0", "0x1000", "0x060400", 0);
    t_.pci(cascade, "0x1000", "0x060400", 0);
    t_.pci(cascade + "/0000:1f:00.0", "0x144d", kNvmeClass, 0);
    t_.block(cascade + "/0000:1f:00.0/nvme/nvme4/nvme4n1", "259:5");
    t_.mkdir("sys/devices/virtual/block/loop0");
    t_.link("sys/dev/block/7:0", "../../devices/virtual/block/loop0");
  }
  PciLocation gpu() const { return locate_pci_function(t_.root(), "0000:1a:00.0"); }
  PciDistanceResult to_disk(unsigned minor) const {
    return pci_distance(gpu(), locate_block_device(t_.root(), DeviceNumber{259, minor}));
  }
  FakeTree t_;
};

TEST_F(TwoSocketServer, GpuChainRunsFromRootPortToFunction) {
  auto g = gpu();
  ASSERT_TRUE(g.known) << g.reason;
  EXPECT_EQ(g.host_bridge, "pci0000:17");
  EXPECT_EQ(g.chain, (std::vector<std::string>{"0000:17:00.0", "0000:18:00.0", "0000:19:00.0",
                                               "0000:1a:00.0"}));
  EXPECT_EQ(g.numa_node, 0);
}

TEST_F(TwoSocketServer, PartitionResolvesToTheNvmeController) {
  auto d = locate_block_device(t_.root(), DeviceNumber{259, 1});
  ASSERT_TRUE(d.known) << d.reason;
  EXPECT_EQ(d.function(), "0000:1b:00.0");
  EXPECT_EQ(d.numa_node, 0);
}

TEST_F(TwoSocketServer, NvmeBehindTheSameSwitchIsPix) {
  auto r = to_disk(1);
  ASSERT_TRUE(r.distance) << r.reason;
  EXPECT_EQ(*r.distance, PciDistance::kPix) << r.reason;
}

TEST_F(TwoSocketServer, NvmeOnTheOtherSocketIsSys) {
  auto r = to_disk(2);
  EXPECT_EQ(r.distance, PciDistance::kSys) << r.reason;
}

TEST_F(TwoSocketServer, NvmeOnAnotherRootComplexOfTheSameSocketIsNode) {
  EXPECT_EQ(to_disk(3).distance, PciDistance::kNode);
}

TEST_F(TwoSocketServer, NvmeUnderAnotherRootPortOfTheSameHostBridgeIsPhb) {
  EXPECT_EQ(to_disk(4).distance, PciDistance::kPhb);
}

TEST_F(TwoSocketServer, NvmeBehindACascadedSwitchIsPxb) {
  EXPECT_EQ(to_disk(5).distance, PciDistance::kPxb);
}

TEST_F(TwoSocketServer, LoopDeviceIsNotPci) {
  auto d = locate_block_device(t_.root(), DeviceNumber{7, 0});
  EXPECT_FALSE(d.known);
  EXPECT_NE(d.reason.find("virtual"), std::string::npos) << d.reason;
  EXPECT_FALSE(pci_distance(gpu(), d).distance);
}

TEST_F(TwoSocketServer, MissingDevicesAreUnknownNotErrors) {
  EXPECT_FALSE(locate_block_device(t_.root(), DeviceNumber{8, 0}).known);
  EXPECT_FALSE(locate_pci_function(t_.root(), "0000:99:00.0").known);
}

TEST(PciTopology, GpuMachineVirtioDiskIsPhbWithoutNumaInformation) {
  FakeTree t;
  t.pci("pci0000:00/0000:00:06.0", "0x10de", kGpuClass, -1);
  t.pci("pci0000:00/0000:00:01.0", "0x1af4", "0x018000", -1);
  t.block("pci0000:00/0000:00:01.0/virtio0/block/vda", "254:0");
  auto disk = locate_block_device(t.root(), DeviceNumber{254, 0});
  ASSERT_TRUE(disk.known) << disk.reason;
  EXPECT_EQ(disk.function(), "0000:00:01.0");
  auto r = pci_distance(locate_pci_function(t.root(), "0000:00:06.0"), disk);
  EXPECT_EQ(r.distance, PciDistance::kPhb) << r.reason;
}

TEST(PciTopology, ParsesPathsWithoutTouchingTheDisk) {
  auto l = parse_sysfs_device_path(
      "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/nvme/nvme0/nvme0n1/nvme0n1p1");
  ASSERT_TRUE(l.known);
  EXPECT_EQ(l.function(), "0000:3b:00.0");
  EXPECT_EQ(l.host_bridge, "pci0000:3a");
  EXPECT_FALSE(parse_sysfs_device_path("sys/devices/virtual/block/zram0").known);
  EXPECT_TRUE(is_pci_address("10000:e1:00.7"));
  EXPECT_FALSE(is_pci_address("0000:3b:00"));
}

TEST(PciTopology, DifferentHostBridgesWithOneNumaUnknownIsUnknown) {
  PciLocation a = parse_sysfs_device_path("sys/devices/pci0000:17/0000:17:00.0");
  PciLocation b = parse_sysfs_device_path("sys/devices/pci0000:d7/0000:d7:00.0");
  a.numa_node = 0;
  auto r = pci_distance(a, b);
  EXPECT_FALSE(r.distance);
  EXPECT_NE(r.reason.find("NODE or SYS"), std::string::npos);
}

}  // namespace
}  // namespace ferry::platform
