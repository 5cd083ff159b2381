// Staging placed on its GPU's NUMA node (io/numa_staging.h): the node read from a sysfs tree,
// no preference on one node or where sysfs says nothing, and the kernel's placement policy set on
// real memory.
#include "io/numa_staging.h"

#include <gtest/gtest.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <vector>

#include "platform/fake_tree.h"

namespace ferry::io {
namespace {

using platform::testing::FakeTree;

TEST(NumaStaging, CountsTheNodesOfASysfsList) {
  EXPECT_EQ(count_node_list("0\n"), 1);
  EXPECT_EQ(count_node_list("0-1\n"), 2);
  EXPECT_EQ(count_node_list("0-3,6"), 5);
  EXPECT_EQ(count_node_list("0,2-3"), 3);
  EXPECT_EQ(count_node_list(""), 0);
  EXPECT_EQ(count_node_list("1-0"), 0);
  EXPECT_EQ(count_node_list("x"), 0);
}

TEST(NumaStaging, TwoNodesPutTheStagingOnTheGpusNode) {
  FakeTree t;
  t.write("sys/devices/system/node/online", "0-1\n");
  t.pci("pci0000:80/0000:80:01.0/0000:81:00.0", "0x10de", "0x030200", 1);
  // cuDeviceGetPCIBusId writes the address in capitals.
  StagingNode n = staging_node_for(t.root(), "0000:81:00.0");
  EXPECT_EQ(n.node, 1) << n.why;
  n = staging_node_for(t.root(), "0000:81:00.0");
  EXPECT_EQ(n.node, 1);
  EXPECT_NE(n.why.find("NUMA node 1"), std::string::npos) << n.why;
}

TEST(NumaStaging, CapitalAddressesAsCudaWritesThemAreFound) {
  FakeTree t;
  t.write("sys/devices/system/node/online", "0-1\n");
  t.pci("pci0000:b0/0000:b0:01.0/0000:b1:00.0", "0x10de", "0x030200", 1);
  EXPECT_EQ(staging_node_for(t.root(), "0000:B1:00.0").node, 1);
}

TEST(NumaStaging, NoPreferenceOnOneNodeOrWithoutAffinityOrAddress) {
  FakeTree one;
  one.write("sys/devices/system/node/online", "0\n");
  one.pci("pci0000:80/0000:80:01.0/0000:81:00.0", "0x10de", "0x030200", 0);
  StagingNode n = staging_node_for(one.root(), "0000:81:00.0");
  EXPECT_EQ(n.node, -1);
  EXPECT_EQ(n.why, "one NUMA node");

  FakeTree none;
  none.write("sys/devices/system/node/online", "0-1\n");
  none.pci("pci0000:80/0000:80:01.0/0000:81:00.0", "0x10de", "0x030200", -1);
  n = staging_node_for(none.root(), "0000:81:00.0");
  EXPECT_EQ(n.node, -1);
  EXPECT_NE(n.why.find("no affinity"), std::string::npos) << n.why;
  n = staging_node_for(none.root(), "0000:99:00.0");
  EXPECT_EQ(n.node, -1);
  EXPECT_NE(n.why.find("unknown"), std::string::npos) << n.why;

  FakeTree empty;
  EXPECT_EQ(staging_node_for(empty.root(), "0000:81:00.0").node, -1);
}

// The preference reaches the kernel: get_mempolicy reads it back for the range (node 0 exists on
// every Linux machine).
TEST(NumaStaging, ThePreferenceIsSetOnTheMemory) {
  const std::size_t bytes = std::size_t{4} << 20;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  if (!prefer_node(p, bytes, 0)) {
    munmap(p, bytes);
    GTEST_SKIP() << "mbind refused here (errno " << errno << "): no NUMA support in this kernel";
  }
  int mode = -1;
  std::vector<unsigned long> mask(1024 / (CHAR_BIT * sizeof(unsigned long)), 0);
  ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, mask.data(), 1024, p, MPOL_F_ADDR), 0);
  EXPECT_EQ(mode, MPOL_PREFERRED);
  EXPECT_EQ(mask[0] & 1UL, 1UL);
  EXPECT_FALSE(prefer_node(p, bytes, -1));
  munmap(p, bytes);
}

}  // namespace
}  // namespace ferry::io
