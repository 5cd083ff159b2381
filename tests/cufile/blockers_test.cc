// What keeps cuFile off nvidia-fs, judged once (cufile/cufile_outlook.h): routing's statfs names
// and explain's mountinfo names meet in one table, and each fact carries its code and whether
// routing acts on it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>

#include "cufile/cufile_outlook.h"
#include "platform/fake_tree.h"
#include "platform/fs_type.h"
#include "test_data.h"

namespace ferry {
namespace {

using cufile::BlockerCode;
using cufile::FsSupport;

TEST(CufileBlockers, StatfsAndMountinfoNamesMeetInOneTable) {
  // statfs cannot tell ext2/3/4 apart; its name for their magic is served, as mountinfo's ext4 is.
  EXPECT_EQ(cufile::fs_support(platform::fs_magic_name(0xEF53)), FsSupport::kServed);
  EXPECT_EQ(cufile::fs_support("ext4"), FsSupport::kServed);
  EXPECT_EQ(cufile::fs_support(platform::fs_magic_name(0x58465342)), FsSupport::kServed);
  for (std::uint64_t rdma : {0x6969u, 0x0BD00BD0u, 0x47504653u, 0x19830326u})
    EXPECT_EQ(cufile::fs_support(platform::fs_magic_name(rdma)), FsSupport::kRdmaClient) << rdma;
  EXPECT_EQ(cufile::fs_support("wekafs"), FsSupport::kRdmaClient);
  for (std::uint64_t not_served : {0x01021994u, 0x794C7630u, 0x9123683Eu, 0x2FC12FC1u, 0x65735546u})
    EXPECT_EQ(cufile::fs_support(platform::fs_magic_name(not_served)), FsSupport::kNotServed)
        << not_served;
  EXPECT_EQ(cufile::fs_support("ext3"), FsSupport::kNotServed);  // mountinfo can tell
}

TEST(CufileBlockers, EveryFactHasItsCodeAndOnlyRoutingsAreDecisive) {
  PlatformReport p;
  p.nvfs.loaded = false;
  p.nvfs.reason = "/proc/driver/nvidia-fs does not exist";
  p.cufile.values.push_back({"properties.force_compat_mode", "true", "file", ""});
  p.iommu = {true, "intel_iommu=on"};
  PlatformStorage s;
  s.fs_type = "ext4";
  s.super_options = "rw,data=journal";
  s.mount_point = "/data";
  s.source = "/dev/vda1";
  s.device = "253:1";
  cufile::Layer2Judgement j = cufile::judge_layer2(p, &s);
  std::vector<BlockerCode> codes;
  for (const auto& b : j.blocking) {
    codes.push_back(b.code);
    const bool routing_acts = b.code == BlockerCode::kForcedCompat ||
                              b.code == BlockerCode::kNvfsMissing ||
                              b.code == BlockerCode::kFileSystem;
    EXPECT_EQ(b.decisive, routing_acts) << b.words;
  }
  EXPECT_EQ(codes, (std::vector<BlockerCode>{BlockerCode::kForcedCompat, BlockerCode::kNvfsMissing,
                                             BlockerCode::kExt4DataMode, BlockerCode::kVirtioDisk,
                                             BlockerCode::kIommuOn}));
  EXPECT_EQ(j.fs_support, "ext4 with data=journal: nvidia-fs needs data=ordered");

  s.fs_type = "btrfs";
  j = cufile::judge_layer2(p, &s);
  ASSERT_EQ(j.blocking.size(), 5u);
  EXPECT_EQ(j.blocking[2].code, BlockerCode::kFileSystem);
  EXPECT_EQ(j.blocking[2].words, "/data is btrfs, which nvidia-fs does not accelerate");
}

// Over one captured machine, routing's decisive facts and explain's list agree on nvidia-fs.
TEST(CufileBlockers, RoutingAndExplainAgreeOnNvidiaFs) {
  for (const char* tree : {"nvfs_absent", "nvfs_rw_on"}) {
    const auto root = test::test_data("platform") / tree;
    std::optional<cufile::Blocker> routing = cufile::process_blocker(root);
    cufile::Layer2Judgement explain = cufile::judge_layer2(read_platform(root), nullptr);
    const bool explain_says = std::any_of(
        explain.blocking.begin(), explain.blocking.end(),
        [](const cufile::Blocker& b) { return b.code == BlockerCode::kNvfsMissing && b.decisive; });
    EXPECT_EQ(routing.has_value(), explain_says) << tree;
    if (routing) {
      EXPECT_EQ(routing->code, BlockerCode::kNvfsMissing) << tree;
    }
    EXPECT_EQ(explain_says, std::string(tree) == "nvfs_absent");
  }
}

TEST(CufileBlockers, RoutingNamesATmpfsFile) {
  struct statfs fs {};
  if (statfs("/dev/shm", &fs) != 0 || static_cast<unsigned long>(fs.f_type) != 0x01021994)
    GTEST_SKIP() << "/dev/shm is not tmpfs here";
  char name[] = "/dev/shm/ferry-blockers-XXXXXX";
  int fd = mkstemp(name);
  ASSERT_GE(fd, 0);
  unlink(name);
  std::optional<cufile::Blocker> b = cufile::file_system_blocker(fd);
  close(fd);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->code, BlockerCode::kFileSystem);
  EXPECT_TRUE(b->decisive);
  EXPECT_EQ(b->words, "the file is on tmpfs, which has no block device for nvidia-fs");
}

// A machine without nvidia-fs whose cuFile is asked to use PCI P2PDMA, which the kernel has:
// routing sends reads to cuFile, and explain no longer predicts the compatibility path.
TEST(CufileBlockers, RoutingAndExplainAgreeOnPciP2pdma) {
  for (const bool published : {true, false}) {
    platform::testing::FakeTree t;
    t.write("etc/cufile.json", R"({"properties": {"use_pci_p2pdma": true}})");
    t.write("proc/sys/kernel/osrelease", "6.8.0-test\n");
    t.write("boot/config-6.8.0-test", "CONFIG_PCI=y\nCONFIG_PCI_P2PDMA=y\n");
    t.pci("pci0000:00/0000:00:01.0/0000:01:00.0");
    if (published) t.mkdir("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/p2pmem");
    std::optional<cufile::Blocker> routing = cufile::process_blocker(t.root());
    cufile::Layer2Judgement explain = cufile::judge_layer2(read_platform(t.root()), nullptr);
    auto nvfs =
        std::find_if(explain.blocking.begin(), explain.blocking.end(),
                     [](const cufile::Blocker& b) { return b.code == BlockerCode::kNvfsMissing; });
    EXPECT_EQ(routing.has_value(), !published);
    EXPECT_EQ(nvfs != explain.blocking.end(), !published);
    if (!published) {
      EXPECT_NE(routing->words.find("PCI P2PDMA is not available"), std::string::npos)
          << routing->words;
      EXPECT_NE(nvfs->words.find("PCI P2PDMA is not available"), std::string::npos) << nvfs->words;
    }
  }
}

}  // namespace
}  // namespace ferry
