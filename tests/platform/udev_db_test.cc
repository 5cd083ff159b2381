#include "platform/udev_db.h"

#include <gtest/gtest.h>

#include "platform/fake_tree.h"

namespace ferry::platform {
namespace {

using testing::FakeTree;

TEST(UdevDb, EntryWithIdFsUsageIsWhatCufileNeeds) {
  FakeTree t;
  t.write("run/udev/data/b254:0",
          "S:disk/by-uuid/1234\nE:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n"
          "G:systemd\n");
  auto e = read_udev_entry(t.root(), DeviceNumber{254, 0});
  EXPECT_EQ(e.state, UdevState::kFound);
  EXPECT_TRUE(e.has_fs_usage);
  EXPECT_EQ(e.properties.at("ID_FS_TYPE"), "ext4");
  EXPECT_EQ(e.properties.count("disk/by-uuid/1234"), 0u) << "only E: lines are properties";
  EXPECT_EQ(e.path, "/run/udev/data/b254:0");
}

TEST(UdevDb, EntryWithoutIdFsUsageExplains5027) {
  FakeTree t;
  t.write("run/udev/data/b259:1", "E:ID_PART_ENTRY_NUMBER=1\n");
  auto e = read_udev_entry(t.root(), DeviceNumber{259, 1});
  EXPECT_EQ(e.state, UdevState::kFound);
  EXPECT_FALSE(e.has_fs_usage);
  EXPECT_NE(e.reason.find("5027"), std::string::npos);
}

TEST(UdevDb, NoRunUdevIsDistinguishedFromNoEntry) {
  FakeTree t;
  auto none = read_udev_entry(t.root(), DeviceNumber{254, 0});
  EXPECT_EQ(none.state, UdevState::kNoUdevDir);
  EXPECT_NE(none.reason.find("/run/udev does not exist"), std::string::npos);
  t.mkdir("run/udev/data");
  auto missing = read_udev_entry(t.root(), DeviceNumber{254, 0});
  EXPECT_EQ(missing.state, UdevState::kNoEntry);
  EXPECT_NE(missing.reason.find("no entry"), std::string::npos);
  EXPECT_NE(missing.reason.find("254:0"), std::string::npos);
}

TEST(UdevDb, ParsesValuesContainingEqualsSigns) {
  auto p = parse_udev_properties("E:ID_FS_LABEL=a=b\nE:=bad\nE:NOEQUALS\n");
  EXPECT_EQ(p.size(), 1u);
  EXPECT_EQ(p.at("ID_FS_LABEL"), "a=b");
}

}  // namespace
}  // namespace ferry::platform
