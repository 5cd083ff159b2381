#include "platform/mountinfo.h"

#include <gtest/gtest.h>

#include "platform/fake_tree.h"
#include "platform/fs_type.h"
#include "platform/text_file.h"
#include "test_data.h"

namespace ferry::platform {
namespace {

std::vector<MountEntry> server(std::vector<std::string>* errors = nullptr) {
  return parse_mountinfo(read_text_file(test::test_data("platform") / "mountinfo/server.txt").text,
                         errors);
}

TEST(Mountinfo, ParsesFieldsAroundTheSeparator) {
  std::vector<std::string> errors;
  auto m = server(&errors);
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(errors.size(), 1u) << "the broken line is reported, not fatal";
  EXPECT_EQ(m[0].mount_point, "/");
  EXPECT_EQ(m[0].device, (DeviceNumber{259, 2}));
  EXPECT_EQ(m[0].optional_fields, std::vector<std::string>{"shared:1"});
  EXPECT_EQ(m[0].fs_type, "ext4");
  EXPECT_EQ(m[0].source, "/dev/nvme0n1p2");
}

TEST(Mountinfo, UnescapesSpacesInMountPoints) {
  auto m = server();
  EXPECT_EQ(m[2].mount_point, "/mnt/fast data");
  EXPECT_EQ(unescape_mount_field("a\\040b\\011c\\134d\\012"), "a b\tc\\d\n");
  EXPECT_EQ(unescape_mount_field("trailing\\04"), "trailing\\04");
}

TEST(Mountinfo, ReportsExt4SuperOptions) {
  auto r = find_mount(server(), "/mnt/fast data/x.bin", DeviceNumber{259, 5});
  ASSERT_TRUE(r.mount);
  EXPECT_TRUE(r.by_device);
  EXPECT_EQ(r.mount->fs_type, "ext4");
  EXPECT_EQ(r.mount->super_options, "rw,data=ordered");
  EXPECT_EQ(r.mount->mount_options, "rw,noatime");
}

TEST(Mountinfo, BindMountOfTheSameDeviceIsFoundByPrefix) {
  auto r = find_mount(server(), "/srv/bound/f", DeviceNumber{259, 5});
  ASSERT_TRUE(r.mount);
  EXPECT_EQ(r.mount->mount_point, "/srv/bound");
  EXPECT_EQ(r.mount->root, "/sub");
}

TEST(Mountinfo, PrefixMatchesWholeComponentsOnly) {
  auto r = find_mount(server(), "/mnt/xfsdata/file", std::nullopt);
  ASSERT_TRUE(r.mount);
  EXPECT_EQ(r.mount->mount_point, "/");
  auto r2 = find_mount(server(), "/mnt/fastdata2/f", std::nullopt);
  EXPECT_EQ(r2.mount->fs_type, "tmpfs");
}

TEST(Mountinfo, FallsBackToPrefixWhenTheDeviceIsNotMounted) {
  auto r = find_mount(server(), "/mnt/xfs/a", DeviceNumber{8, 1});
  ASSERT_TRUE(r.mount);
  EXPECT_FALSE(r.by_device);
  EXPECT_EQ(r.mount->fs_type, "xfs");
  EXPECT_NE(r.how.find("no mount of device 8:1"), std::string::npos);
}

TEST(Mountinfo, LaterMountOnTheSamePointHidesTheEarlierOne) {
  auto m =
      parse_mountinfo(read_text_file(test::test_data("platform") / "mountinfo/gpu_vm.txt").text);
  auto r = find_mount(m, "/dev/shm/x", std::nullopt);
  ASSERT_TRUE(r.mount);
  EXPECT_EQ(r.mount->mount_id, 31);
}

TEST(Mountinfo, GpuMachineRootIsExt4OnVda) {
  auto m =
      parse_mountinfo(read_text_file(test::test_data("platform") / "mountinfo/gpu_vm.txt").text);
  auto r = find_mount(m, "/root/data.bin", DeviceNumber{254, 0});
  ASSERT_TRUE(r.mount);
  EXPECT_EQ(r.mount->source, "/dev/vda");
  EXPECT_EQ(to_string(r.mount->device), "254:0");
}

TEST(Mountinfo, MissingMountinfoIsUnknownWithReason) {
  testing::FakeTree t;
  auto r = find_mount_for_file(t.root(), "/");
  EXPECT_FALSE(r.mount);
  EXPECT_NE(r.how.find("mountinfo"), std::string::npos);
}

TEST(Mountinfo, RealFileIsFoundInTheRealMountTable) {
  auto r = find_mount_for_file("/", "/proc/self/mountinfo");
  ASSERT_TRUE(r.mount) << r.how;
  EXPECT_EQ(r.mount->fs_type, "proc");
  EXPECT_TRUE(r.by_device);
}

TEST(FsType, NamesProcAndReportsMissingPaths) {
  auto t = statfs_type("/proc");
  ASSERT_TRUE(t.ok);
  EXPECT_EQ(t.name, "proc");
  auto missing = statfs_type("/no/such/path");
  EXPECT_FALSE(missing.ok);
  EXPECT_NE(missing.error.find("No such file"), std::string::npos);
  EXPECT_EQ(fs_magic_name(0xEF53), "ext2/ext3/ext4");
  EXPECT_EQ(fs_magic_name(0x58465342), "xfs");
  EXPECT_EQ(fs_magic_name(0x12), "unknown (0x12)");
}

}  // namespace
}  // namespace ferry::platform
