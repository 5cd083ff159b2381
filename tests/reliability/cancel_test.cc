// Requests that stop early: cancelled by the caller (IoFuture::cancel), or failed by one task
// while others ran. Either way the error's bytes_done is a prefix that is really in place.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "reliability/scripted_io.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::ScriptedIo;
using test::TempDir;
using namespace std::chrono_literals;

constexpr std::size_t kTask = 64 << 10;

TEST(Cancel, StopsTheTasksNotStartedAndCountsThePrefixInPlace) {
  TempDir dir;
  auto path = dir / "c.bin";
  auto data = test::pattern_bytes(16 << 20, 1);
  test::write_file(path, data);
  ScriptedIo io;
  io.slow_offset = 2 * kTask + 1;  // the third task sleeps while the test cancels
  io.slow = 300ms;
  File f = test::open_scripted(io, path, "r", "64KiB", "1");
  std::vector<unsigned char> buf(data.size(), 0xEE);
  IoFuture fut = f.pread(buf.data(), buf.size(), 0);
  std::this_thread::sleep_for(100ms);
  const auto asked = std::chrono::steady_clock::now();
  EXPECT_TRUE(fut.cancel());
  try {
    fut.get();
    FAIL() << "a cancelled read reported success";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), ECANCELED) << e.what();
    EXPECT_EQ(e.bytes_done(), 3 * kTask) << e.what();  // the task in flight finished
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - asked, 1s);
  EXPECT_EQ(0, std::memcmp(buf.data(), data.data(), 3 * kTask));
  for (std::size_t i = 3 * kTask; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xEE) << i;
  EXPECT_FALSE(fut.cancel());  // complete now
  // The File takes the next request.
  EXPECT_EQ(f.read(buf.data(), buf.size(), 0), buf.size());
  EXPECT_EQ(0, std::memcmp(buf.data(), data.data(), buf.size()));
}

TEST(Cancel, ACancelledWriteLeavesExactlyItsPrefixInTheFile) {
  TempDir dir;
  auto path = dir / "w.bin";
  auto data = test::pattern_bytes(8 << 20, 2);
  ScriptedIo io;
  io.slow_offset = 4 * kTask + 7;
  io.slow = 300ms;
  File f = test::open_scripted(io, path, "w", "64KiB", "1");
  IoFuture fut = f.pwrite(data.data(), data.size(), 0);
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(fut.cancel());
  try {
    fut.get();
    FAIL() << "a cancelled write reported success";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), ECANCELED) << e.what();
    EXPECT_EQ(e.bytes_done(), 5 * kTask) << e.what();
    EXPECT_EQ(e.bytes_done(), io.bytes_written.load());
  }
  auto on_disk = test::read_file(path);
  ASSERT_EQ(on_disk.size(), 5 * kTask);
  EXPECT_EQ(0, std::memcmp(on_disk.data(), data.data(), on_disk.size()));
}

TEST(Cancel, OfACompletedRequestIsFalseAndChangesNothing) {
  TempDir dir;
  auto path = dir / "s.bin";
  auto data = test::pattern_bytes(1 << 20, 3);
  test::write_file(path, data);
  File f(path);
  std::vector<unsigned char> buf(4096);
  IoFuture small = f.pread(buf.data(), buf.size(), 0);  // runs in this thread: already done
  EXPECT_FALSE(small.cancel());
  EXPECT_EQ(small.get(), buf.size());
  std::vector<unsigned char> all(data.size());
  IoFuture big = f.pread(all.data(), all.size(), 0);
  big.wait();
  EXPECT_FALSE(big.cancel());
  EXPECT_EQ(big.get(), all.size());
}

// A failed task beside tasks that completed after it: bytes_done counts only the prefix up to
// the failure (the issue: it was the sum of every task, bytes beyond a gap included, so a caller
// resuming at bytes_done would have skipped the failed range).
// O_DIRECT, whose writes run on several workers (buffered writes to one file have one).
TEST(Faults, AFailedWriteReportsTheContiguousPrefixNotTheSum) {
  TempDir dir(std::filesystem::current_path().string());  // a file system that takes O_DIRECT
  auto path = dir / "p.bin";
  auto data = test::pattern_bytes(1 << 20, 4);  // 16 tasks of 64 KiB
  ScriptedIo io;
  io.fail_offset = kTask + 100;  // the second task fails, after the others have run
  io.fail_errno = EIO;
  io.slow_offset = io.fail_offset;
  io.slow = 200ms;
  File f = test::open_scripted(io, path, "w", "64KiB", "4", /*direct=*/true);
  try {
    f.write(data.data(), data.size(), 0);
    FAIL() << "write reported success despite EIO";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EIO);
    EXPECT_EQ(e.bytes_done(), kTask) << e.what();
    EXPECT_GT(io.bytes_written.load(), kTask);  // later tasks did reach the file
  }
  auto on_disk = test::read_file(path);
  ASSERT_GE(on_disk.size(), kTask);
  EXPECT_EQ(0, std::memcmp(on_disk.data(), data.data(), kTask));
}

}  // namespace
}  // namespace ferry
