#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>

#include "ferry/ferry.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::expect_io_error;
using test::TempDir;

TEST(FileErrors, MissingFileNamesThePath) {
  TempDir dir;
  auto p = (dir / "missing.bin").string();
  expect_io_error([&] { File f(p); }, p, ENOENT);
}

TEST(FileErrors, DirectoryIsRefusedAtOpen) {
  TempDir dir;
  expect_io_error([&] { File f(dir.path()); }, dir.path().string(), EISDIR);
}

TEST(FileErrors, FifoIsRefusedWithoutBlocking) {
  TempDir dir;
  auto p = (dir / "fifo").string();
  ASSERT_EQ(mkfifo(p.c_str(), 0600), 0);
  expect_io_error([&] { File f(p); }, p, EINVAL);
}

TEST(FileErrors, InvalidModeIsAnError) {
  TempDir dir;
  test::write_file(dir / "m.bin", {1});
  EXPECT_THROW(File(dir / "m.bin", "rw"), Error);
}

TEST(FileErrors, ReadOnlyFileOpenedReadOnlyRefusesWrites) {
  TempDir dir;
  auto p = (dir / "ro.bin").string();
  test::write_file(p, {1, 2, 3});
  File f(p, "r");
  unsigned char b[3] = {};
  expect_io_error([&] { f.write(b, 3, 0); }, p, EBADF);
}

TEST(FileErrors, WriteOnlyFileRefusesReads) {
  TempDir dir;
  auto p = (dir / "wo.bin").string();
  File f(p, "w");
  unsigned char b[3] = {};
  expect_io_error([&] { f.read(b, 3, 0); }, p, EBADF);
}

// Permission checks are bypassed by root, so the denied opens run in a child process that
// drops to the unprivileged 'nobody' user (uid 65534) first.
int run_as_nobody(const std::function<int()>& body) {
  pid_t pid = fork();
  if (pid == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(77);
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 99;
}

TEST(FileErrors, PermissionDeniedNamesThePath) {
  TempDir dir;
  auto p = (dir / "secret.bin").string();
  test::write_file(p, {1, 2, 3});
  chmod(p.c_str(), 0600);
  chmod(dir.path().c_str(), 0755);
  if (geteuid() != 0) {
    expect_io_error([&] { File f("/etc/shadow"); }, "/etc/shadow", EACCES);
    return;
  }
  int rc = run_as_nobody([&] {
    try {
      File f(p);
    } catch (const IoError& e) {
      return e.error_code() == EACCES && std::string(e.what()).find(p) != std::string::npos ? 0 : 1;
    }
    return 2;
  });
  if (rc == 77) GTEST_SKIP() << "cannot drop privileges to uid 65534 here";
  EXPECT_EQ(rc, 0);
}

TEST(FileErrors, ReadOnlyFileOpenedForWritingIsDenied) {
  TempDir dir;
  auto p = (dir / "readonly.bin").string();
  test::write_file(p, {1, 2, 3});
  chmod(p.c_str(), 0444);
  chmod(dir.path().c_str(), 0755);
  if (geteuid() != 0) {
    expect_io_error([&] { File f(p, "r+"); }, p, EACCES);
    return;
  }
  int rc = run_as_nobody([&] {
    try {
      File f(p, "r+");
    } catch (const IoError& e) {
      return e.error_code() == EACCES ? 0 : 1;
    }
    return 2;
  });
  if (rc == 77) GTEST_SKIP() << "cannot drop privileges to uid 65534 here";
  EXPECT_EQ(rc, 0);
}

TEST(FileErrors, FileThatShrinksBetweenOpenAndReadGivesAShortCount) {
  TempDir dir;
  auto p = dir / "shrink.bin";
  auto data = test::random_bytes(1 << 20, 21);
  test::write_file(p, data);
  FileOptions options;
  options.settings.set("task_size", "64KiB");
  File f(p, "r", options);
  ASSERT_EQ(truncate(p.c_str(), 300000), 0);
  std::vector<unsigned char> buf(1 << 20);
  EXPECT_EQ(f.read(buf.data(), buf.size(), 0), 300000u);
  EXPECT_EQ(0, std::memcmp(buf.data(), data.data(), 300000));
}

TEST(FileErrors, NullBufferIsAnErrorNamingTheFile) {
  TempDir dir;
  auto p = (dir / "n.bin").string();
  test::write_file(p, {1, 2, 3});
  File f(p);
  expect_io_error([&] { f.read(nullptr, 3, 0); }, p, EFAULT);
}

TEST(FileErrors, OffsetPlusSizeOverflowIsAnError) {
  TempDir dir;
  auto p = (dir / "o.bin").string();
  test::write_file(p, {1, 2, 3});
  File f(p);
  char b[4];
  expect_io_error([&] { f.read(b, 4, std::uint64_t{LLONG_MAX} - 1); }, p, EOVERFLOW);
}

TEST(FileErrors, ClosedFileIsAnError) {
  TempDir dir;
  test::write_file(dir / "c.bin", {1});
  File f(dir / "c.bin");
  f.close();
  char b[1];
  EXPECT_THROW(f.read(b, 1, 0), IoError);
  EXPECT_FALSE(f.is_open());
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

// Stream-ordered requests need the CUDA driver even into host memory (a stream is a CUDA
// object): without one, the future holds a CudaError saying why, and nothing was read.
TEST(FileErrors, StreamOrderedRequestsWithoutACudaDriverAreAClearCudaError) {
  CudaStatus cuda = cuda_status();
  if (cuda.available) GTEST_SKIP() << "a CUDA driver is present: tests/gpu covers read_async";
  test::TempDir dir;
  test::write_file(dir / "f.bin", test::pattern_bytes(1 << 20, 5));
  std::vector<unsigned char> buf(1 << 20, 0xEE);
  File f(dir / "f.bin", "r+");
  IoFuture r = f.read_async(buf.data(), buf.size(), 0, nullptr);
  try {
    r.get();
    FAIL() << "read_async without a driver succeeded";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA driver"), std::string::npos) << e.what();
  }
  EXPECT_EQ(buf, std::vector<unsigned char>(1 << 20, 0xEE));
  IoFuture w = f.write_async(buf.data(), buf.size(), 0, nullptr);
  EXPECT_THROW(w.get(), CudaError);
  EXPECT_EQ(test::read_file(dir / "f.bin"), test::pattern_bytes(1 << 20, 5));
  // A read of nothing (at the end of the file) has nothing to order and succeeds.
  EXPECT_EQ(f.read_async(buf.data(), 16, 1 << 20, nullptr).get(), 0u);
}

}  // namespace
}  // namespace ferry
