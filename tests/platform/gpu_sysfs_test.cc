#include "platform/gpu_sysfs.h"

#include <gtest/gtest.h>

#include "platform/fake_tree.h"

namespace ferry::platform {
namespace {

using testing::FakeTree;

// The H200's resource file on the GPU machine (2026-11-30): a 64-bit BAR0, so BAR1 is line 2.
constexpr const char* kH200Resource =
    "0x0000104002000000 0x0000104002ffffff 0x000000000014220c\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x0000100000000000 0x0000103fffffffff 0x000000000014220c\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x0000104000000000 0x0000104001ffffff 0x000000000014220c\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n";

// An older layout: 32-bit BAR0 (registers), BAR1 64-bit at line 1, BAR3 at line 3, I/O at 5.
constexpr const char* kClassicResource =
    "0x00000000fa000000 0x00000000faffffff 0x0000000000040200\n"
    "0x000000e000000000 0x000000e00fffffff 0x000000000014220c\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x000000e010000000 0x000000e011ffffff 0x000000000014220c\n"
    "0x0000000000000000 0x0000000000000000 0x0000000000000000\n"
    "0x000000000000e000 0x000000000000e07f 0x0000000000040101\n"
    "0x00000000fb000000 0x00000000fb07ffff 0x0000000000046200\n";

TEST(GpuSysfs, Bar1IsTheSecondMemoryBarOnH200) {
  EXPECT_EQ(nvidia_bar1_size(parse_pci_resource(kH200Resource)), std::uint64_t{256} << 30);
}

TEST(GpuSysfs, Bar1IsLineOneWhenBar0Is32Bit) {
  EXPECT_EQ(nvidia_bar1_size(parse_pci_resource(kClassicResource)), std::uint64_t{256} << 20);
}

TEST(GpuSysfs, FindsNvidiaDisplayAnd3dControllersOnly) {
  FakeTree t;
  t.pci("pci0000:00/0000:00:06.0", "0x10de", "0x030200", -1);
  t.write("sys/devices/pci0000:00/0000:00:06.0/resource", kH200Resource);
  t.write("sys/devices/pci0000:00/0000:00:06.0/device", "0x2335\n");
  t.pci("pci0000:00/0000:00:07.0", "0x10de", "0x068000", -1);  // an NVSwitch bridge
  t.pci("pci0000:00/0000:00:01.0", "0x1af4", "0x018000", -1);
  auto list = read_gpus(t.root());
  ASSERT_TRUE(list.known);
  ASSERT_EQ(list.gpus.size(), 1u);
  EXPECT_EQ(list.gpus[0].bus_id, "0000:00:06.0");
  EXPECT_EQ(list.gpus[0].numa_node, -1);
  EXPECT_EQ(list.gpus[0].device_id, 0x2335u);
  EXPECT_EQ(list.gpus[0].bar1_bytes, std::uint64_t{256} << 30);
}

TEST(GpuSysfs, MissingSysfsIsUnknown) {
  FakeTree t;
  auto list = read_gpus(t.root());
  EXPECT_FALSE(list.known);
  EXPECT_FALSE(list.reason.empty());
}

TEST(GpuSysfs, DriverVersionFromOpenAndProprietaryModules) {
  EXPECT_EQ(parse_nvidia_driver_version(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release "
                "Build  (nixbld@)\nGCC version:  gcc version 15.3.0 (GCC)\n"),
            "580.159.04");
  EXPECT_EQ(parse_nvidia_driver_version(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 "
                "UTC 2023\n"),
            "535.104.05");
  FakeTree t;
  auto d = read_nvidia_driver_version(t.root());
  EXPECT_FALSE(d.version);
  EXPECT_NE(d.reason.find("not loaded"), std::string::npos);
}

}  // namespace
}  // namespace ferry::platform
