// Paths that are not regular files ferry can use: each gives an IoError naming the path, never
// a hang, a crash or a silent empty read. Complements tests/posix/file_error_test.cc (missing
// file, directory, FIFO, permissions).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "ferry/ferry.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::expect_io_error;
using test::TempDir;

TEST(BadPaths, SocketIsRefusedAtOpen) {
  TempDir dir;
  auto p = (dir / "sock").string();
  int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(p.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, p.c_str(), p.size() + 1);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  // open(2) of a socket fails with ENXIO before ferry sees its type.
  expect_io_error([&] { File f(p); }, p, ENXIO);
  expect_io_error([&] { File f(p, "r+"); }, p, ENXIO);
  ::close(s);
}

TEST(BadPaths, CharacterDeviceIsRefusedAtOpen) {
  expect_io_error([&] { File f("/dev/null"); }, "/dev/null", EINVAL);
  expect_io_error([&] { File f("/dev/zero", "r+"); }, "/dev/zero", EINVAL);
}

TEST(BadPaths, DanglingSymlinkIsMissingForReading) {
  TempDir dir;
  auto link = (dir / "dangling").string();
  ASSERT_EQ(::symlink((dir / "nowhere").c_str(), link.c_str()), 0);
  expect_io_error([&] { File f(link); }, link, ENOENT);
  expect_io_error([&] { File f(link, "r+"); }, link, ENOENT);
}

TEST(BadPaths, WritingThroughADanglingSymlinkCreatesItsTarget) {
  // What open(2) with O_CREAT does; documented in docs/reliability.md.
  TempDir dir;
  auto link = dir / "dangling";
  ASSERT_EQ(::symlink((dir / "target").c_str(), link.c_str()), 0);
  File f(link, "w");
  unsigned char b[3] = {7, 8, 9};
  EXPECT_EQ(f.write(b, 3, 0), 3u);
  EXPECT_EQ(test::read_file(dir / "target"), (std::vector<unsigned char>{7, 8, 9}));
}

TEST(BadPaths, SymlinkLoopIsAnError) {
  TempDir dir;
  auto a = (dir / "a").string(), b = (dir / "b").string();
  ASSERT_EQ(::symlink(b.c_str(), a.c_str()), 0);
  ASSERT_EQ(::symlink(a.c_str(), b.c_str()), 0);
  expect_io_error([&] { File f(a); }, a, ELOOP);
  expect_io_error([&] { File f(a, "w"); }, a, ELOOP);
}

TEST(BadPaths, PathLongerThanPathMaxIsAnError) {
  std::string p = "/tmp/" + std::string(PATH_MAX, 'x');
  expect_io_error([&] { File f(p); }, p, ENAMETOOLONG);
  expect_io_error([&] { File f(p, "w"); }, p, ENAMETOOLONG);
}

TEST(BadPaths, ComponentLongerThanNameMaxIsAnError) {
  TempDir dir;
  auto p = (dir / std::string(NAME_MAX + 1, 'y')).string();
  expect_io_error([&] { File f(p, "w"); }, p, ENAMETOOLONG);
}

TEST(BadPaths, EmptyPathIsMissing) {
  expect_io_error([&] { File f(""); }, "", ENOENT);
}

TEST(BadPaths, FileUnderARegularFileIsNotADirectory) {
  TempDir dir;
  test::write_file(dir / "plain", {1});
  auto p = (dir / "plain" / "child").string();
  expect_io_error([&] { File f(p); }, p, ENOTDIR);
}

// /proc files report st_size 0 yet have contents; a read that trusted st_size would hand back
// 0 bytes as if the file were empty. ferry refuses them at open (docs/reliability.md).
TEST(BadPaths, ProcFileWithSizeZeroIsRefusedNotReadAsEmpty) {
  const std::string p = "/proc/self/status";
  try {
    File f(p);
    std::vector<char> buf(1 << 16);
    std::size_t n = f.read(buf.data(), buf.size(), 0);
    FAIL() << p << " opened and read " << n << " bytes although it has contents";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EINVAL) << e.what();
    EXPECT_EQ(e.path(), p);
  }
}

}  // namespace
}  // namespace ferry
