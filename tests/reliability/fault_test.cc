// Faults at the POSIX backend's I/O seam that tests/posix/fault_injection_test.cc does not cover:
// EAGAIN, EDQUOT, a pwrite that moves nothing, a slow task beside a failing one, a file cut
// short mid-read, and failures of open, fstat, fsync and O_DIRECT. Each checks that the error
// names the file, that a failed write counts exactly the bytes that reached the file, and that
// the pool and the file stay usable.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "reliability/scripted_io.h"
#include "test_runtime.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::ScriptedIo;
using test::TempDir;

TEST(Faults, EagainIsRetriedOnReadsAndWrites) {
  TempDir dir;
  auto data = test::random_bytes(300000, 1);
  test::write_file(dir / "a.bin", data);
  ScriptedIo io;
  io.transient_left = 50;
  File f = test::open_scripted(io, dir / "a.bin", "r+");
  std::vector<unsigned char> buf(data.size());
  EXPECT_EQ(f.read(buf.data(), buf.size(), 0), data.size());
  EXPECT_EQ(buf, data);
  io.transient_left = 50;
  EXPECT_EQ(f.write(data.data(), data.size(), 1000), data.size());
  EXPECT_EQ(io.bytes_written.load(), data.size());
}

// Issue 11: EAGAIN was retried without bound, so a file system that always answers it spun a
// worker forever. Now it is retried with backoff for about 2 s, then reported.
TEST(Faults, EagainForeverIsAnErrorAfterBoundedRetries) {
  TempDir dir;
  auto data = test::random_bytes(100000, 2);
  test::write_file(dir / "a.bin", data);
  ScriptedIo io;
  io.transient_left = 1 << 30;
  File f = test::open_scripted(io, dir / "a.bin", "r+", "64KiB", "1");
  std::vector<unsigned char> buf(data.size());
  const auto t0 = std::chrono::steady_clock::now();
  test::expect_io_error([&] { f.read(buf.data(), buf.size(), 0); }, (dir / "a.bin").string(),
                        EAGAIN);
  test::expect_io_error([&] { f.write(data.data(), 4096, 0); }, (dir / "a.bin").string(), EAGAIN);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}

// bytes_done is the prefix known to be in the file (issue 11: it was the sum of every task's
// bytes, gaps included); tasks after the failure may have written more.
TEST(Faults, EdquotOnWriteCountsThePrefixThatReachedTheFile) {
  TempDir dir;
  auto path = (dir / "quota.bin").string();
  ScriptedIo io;
  io.fail_offset = 700000;
  io.fail_errno = EDQUOT;
  File f = test::open_scripted(io, path, "w");
  auto data = test::random_bytes(2 << 20, 2);
  try {
    f.write(data.data(), data.size(), 0);
    FAIL() << "write reported success despite EDQUOT";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EDQUOT);
    EXPECT_EQ(e.path(), path);
    EXPECT_LE(e.offset(), 700000u);
    EXPECT_GT(e.offset() + e.length(), 700000u);
    EXPECT_EQ(e.bytes_done(), 700000u / (64 << 10) * (64 << 10)) << e.what();
    EXPECT_LE(e.bytes_done(), io.bytes_written.load()) << e.what();
    auto on_disk = test::read_file(path);
    ASSERT_GE(on_disk.size(), e.bytes_done());
    EXPECT_EQ(0, std::memcmp(on_disk.data(), data.data(), e.bytes_done()));
    EXPECT_NE(std::string(e.what()).find("quota"), std::string::npos) << e.what();
  }
  // The same file takes the next write once the fault clears.
  io.fail_offset = -1;
  EXPECT_EQ(f.write(data.data(), data.size(), 0), data.size());
  EXPECT_EQ(test::read_file(path), data);
}

TEST(Faults, WriteThatMovesNothingIsAnErrorNotALoop) {
  TempDir dir;
  auto path = (dir / "zero.bin").string();
  ScriptedIo io;
  io.zero_writes = true;
  File f = test::open_scripted(io, path, "w");
  auto data = test::random_bytes(100000, 3);
  try {
    f.write(data.data(), data.size(), 0);
    FAIL() << "a pwrite that wrote nothing was reported as success";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EIO);
    EXPECT_EQ(e.bytes_done(), 0u);
    EXPECT_NE(std::string(e.what()).find("wrote nothing"), std::string::npos) << e.what();
  }
}

TEST(Faults, SlowTaskBesideAFailingOneFinishesBeforeTheRequestReturns) {
  TempDir dir;
  auto path = dir / "slow.bin";
  // 256 tasks, the 17th failing. Every transfer takes 4 ms, so the three workers beside the slow
  // one need about 340 ms to run all 255 others: the failure (seen after about 20 ms) stops them
  // unless its worker stalls for a third of a second. Without the 4 ms a loaded CI machine ran
  // all 256 page-cached reads before the failing worker had recorded its error.
  test::write_file(path, test::random_bytes(16 << 20, 4));
  ScriptedIo io;
  io.slow_offset = 0;
  io.slow = std::chrono::milliseconds(500);
  io.every = std::chrono::microseconds(4000);
  io.fail_offset = 1 << 20;
  File f = test::open_scripted(io, path, "r", "64KiB", "4");
  std::vector<unsigned char> buf(16 << 20);
  IoFuture fut = f.pread(buf.data(), buf.size(), 0);
  EXPECT_THROW(fut.get(), IoError);
  // No task of the request is still inside a system call once it has returned, and the tasks
  // not yet started were dropped.
  EXPECT_EQ(io.in_flight.load(), 0);
  int calls = io.calls.load();
  EXPECT_LT(calls, 256);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(io.calls.load(), calls) << "a task of the failed request ran after it returned";
}

TEST(Faults, FileCutShortMidReadGivesTheBytesBeforeTheCutAndNoMore) {
  TempDir dir;
  auto path = dir / "cut.bin";
  auto data = test::random_bytes(1 << 20, 5);
  test::write_file(path, data);
  ScriptedIo io;
  io.truncate_at_offset = 512 << 10;  // when the task at 512 KiB starts, cut the file to 200000
  io.truncate_path = path;
  io.truncate_to = 200000;
  File f = test::open_scripted(io, path, "r", "64KiB", "1");
  std::vector<unsigned char> buf(1 << 20, 0xEE);
  std::size_t n = f.read(buf.data(), buf.size(), 0);
  // With one thread the tasks before 512 KiB completed in full before the cut; a caller is never
  // told more bytes than are valid, and all that it is told are the file's.
  EXPECT_GE(n, 200000u);
  EXPECT_LE(n, 512u << 10);
  EXPECT_EQ(0, std::memcmp(buf.data(), data.data(), n));
}

// Issue 30, finding 15: a sysfs attribute reports 4096 B and holds fewer; a buffered read that
// meets its end early failed with "O_DIRECT cannot resume mid-block". Buffered, 0 is the end.
TEST(Faults, ABufferedReadEndsWhereTheFileEndsWhateverFstatSaid) {
  TempDir dir;
  auto path = dir / "attribute";
  const std::string text = "always [madvise] never\n";
  test::write_file(path, std::vector<unsigned char>(text.begin(), text.end()));
  ScriptedIo io;
  io.stat_size = 4096;
  File f = test::open_scripted(io, path, "r", "1MiB", "1");
  ASSERT_EQ(f.size(), 4096u);
  std::vector<char> buf(4096, '\0');
  EXPECT_EQ(f.read(buf.data(), buf.size()), text.size());
  EXPECT_EQ(std::string(buf.data(), text.size()), text);
}

// Issue 11: a short O_DIRECT read was taken as the end of the file, so NFS or FUSE returning
// short counts would have truncated reads silently. Block-aligned short counts read on; others
// fail naming the offset, never a short result.
TEST(Faults, ShortODirectReadsBeforeTheEndAreNotTheEnd) {
  TempDir dir;
  auto path = dir / "short.bin";
  auto data = test::random_bytes((1 << 20) + 12345, 6);
  test::write_file(path, data);
  ScriptedIo io;
  io.direct_read_cap = 64 << 10;
  File f = test::open_scripted(io, path, "r", "1MiB", "2", /*direct=*/true);
  {
    std::vector<unsigned char> buf(data.size() + 100, 0xEE);
    const std::size_t n = f.read(buf.data(), buf.size(), 0);
    EXPECT_EQ(n, data.size());
    EXPECT_EQ(0, std::memcmp(buf.data(), data.data(), data.size()));
  }
  ScriptedIo odd;
  odd.direct_read_cap = 1000;  // not a whole block
  File g = test::open_scripted(odd, path, "r", "1MiB", "2", /*direct=*/true);
  std::vector<unsigned char> buf(1 << 20);
  try {
    g.read(buf.data(), buf.size(), 0);
    ADD_FAILURE() << "a short O_DIRECT read before the end was taken as the end";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EIO) << e.what();
    EXPECT_NE(std::string(e.what()).find("short read"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
}

// Cold tasks read with O_DIRECT; where the file refuses O_DIRECT they stay buffered, and the
// report says so (no silent fallback), with every byte right.
TEST(Faults, ColdTasksOnAFileThatRefusesDirectIoStayBufferedAndSaySo) {
  TempDir dir;
  auto path = dir / "cold.bin";
  auto data = test::random_bytes(4 << 20, 9);
  test::write_file(path, data);
  ScriptedIo io;
  io.refuse_direct = true;
  test::set_resident_fraction(0.0);
  File f = test::open_scripted(io, path, "r", "1MiB", "2", false, test::residency_runtime());
  std::vector<unsigned char> buf(data.size());
  EXPECT_EQ(f.read(buf.data(), buf.size()), buf.size());
  test::set_resident_fraction(std::nullopt);
  EXPECT_EQ(buf, data);
  RouteReport r = f.last_route();
  EXPECT_EQ(r.direct_tasks, 0u);
  bool said = false;
  for (const RouteReason& reason : r.reasons) {
    if (reason.code == ReasonCode::kDirectIoRefused) {
      said = true;
      EXPECT_NE(reason.text.find(path.string()), std::string::npos) << reason.text;
      EXPECT_NE(reason.text.find("cold tasks read buffered"), std::string::npos) << reason.text;
    }
  }
  EXPECT_TRUE(said) << r.to_text();
}

TEST(Faults, OpenFailureNamesThePathAndLeaksNothing) {
  TempDir dir;
  auto path = (dir / "emfile.bin").string();
  test::write_file(path, {1, 2, 3});
  ScriptedIo io;
  io.open_errno = EMFILE;
  try {
    test::open_scripted(io, path, "r");
    FAIL() << "open reported success despite EMFILE";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EMFILE);
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.op(), "open");
  }
}

TEST(Faults, FstatFailureAtOpenClosesTheDescriptor) {
  TempDir dir;
  auto path = (dir / "fstat.bin").string();
  test::write_file(path, {1, 2, 3});
  ScriptedIo io;
  io.fstat_errno = EIO;
  EXPECT_THROW(test::open_scripted(io, path, "r"), IoError);
  EXPECT_EQ(io.opens.load(), 1);
  EXPECT_EQ(io.closes.load(), 1);
}

TEST(Faults, FsyncFailureIsAnErrorNamingTheFile) {
  TempDir dir;
  auto path = (dir / "sync.bin").string();
  ScriptedIo io;
  io.fsync_errno = EIO;
  File f = test::open_scripted(io, path, "w");
  unsigned char b[10] = {};
  ASSERT_EQ(f.write(b, sizeof b, 0), sizeof b);
  try {
    f.sync();
    FAIL() << "sync reported success despite EIO";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EIO);
    EXPECT_EQ(e.op(), "fsync");
    EXPECT_EQ(e.path(), path);
  }
}

TEST(Faults, RefusedODirectFallsBackToBufferedIoWithAReason) {
  TempDir dir;
  auto path = dir / "direct.bin";
  auto data = test::random_bytes(300000, 6);
  test::write_file(path, data);
  ScriptedIo io;
  io.refuse_direct = true;
  File f = test::open_scripted(io, path, "r", "64KiB", "4", /*direct=*/true);
  std::vector<unsigned char> buf(data.size());
  EXPECT_EQ(f.read(buf.data(), buf.size(), 0), data.size());
  EXPECT_EQ(buf, data);
  bool said_why = false;
  for (const RouteReason& r : f.last_route().reasons) {
    said_why = said_why || r.text.find("O_DIRECT refused") != std::string::npos;
  }
  EXPECT_TRUE(said_why) << "the fallback from O_DIRECT left no reason in the route";
}

TEST(Faults, EioUnderODirectNamesTheDirectCallAndThePoolStaysUsable) {
  TempDir dir;
  auto path = (dir / "direct-eio.bin").string();
  auto data = test::random_bytes(1 << 20, 7);
  test::write_file(path, data);
  ScriptedIo io;
  io.fail_offset = 300000;
  io.fail_times = 1;
  File f = test::open_scripted(io, path, "r", "64KiB", "4", /*direct=*/true);
  std::vector<unsigned char> buf(data.size());
  try {
    f.read(buf.data() + 1, buf.size() - 1, 1);  // unaligned: through the staging buffers
    FAIL() << "read reported success despite EIO";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EIO);
    EXPECT_EQ(e.path(), path);
    EXPECT_NE(e.op().find("pread"), std::string::npos);
  }
  EXPECT_EQ(f.read(buf.data(), buf.size(), 0), data.size());
  EXPECT_EQ(buf, data);
}

TEST(Faults, CloseErrorIsReported) {
  // Was a gap: close() errors were dropped, so a file system that reports a lost write only at
  // close (NFS) went unnoticed. File::close() now throws; only the destructor stays silent.
  TempDir dir;
  ScriptedIo io;
  io.close_errno = EIO;
  File f = test::open_scripted(io, dir / "close.bin", "w");
  EXPECT_THROW(f.close(), IoError);
  EXPECT_FALSE(f.is_open());
}

// An append reserves its range (reading the file's size), then writes it. A close() that began
// between the two refused the write, so the append failed after its range was taken, and a later
// append's bytes sat behind a hole of zeros (seen under TSan in CI). The reservation and the write
// are one registration now: the close waits for the append, which completes.
TEST(FileAppend, ACloseDuringTheReservationWaitsForTheWriteInsteadOfRefusingIt) {
  TempDir dir;
  auto path = dir / "a.bin";
  test::write_file(path, test::pattern_bytes(8192, 9));
  ScriptedIo io;
  File f = test::open_scripted(io, path, "a");
  io.slow = std::chrono::milliseconds(300);
  io.slow_fstats = 1;  // the reservation's fstat
  std::vector<unsigned char> block(4096, 0x5A);
  std::atomic<int> outcome{-1};
  std::thread appender([&] {
    try {
      outcome = static_cast<int>(f.append(block.data(), block.size()));
    } catch (const IoError& e) {
      outcome = -e.error_code();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  f.close();
  appender.join();
  EXPECT_EQ(outcome.load(), 4096) << "the append was refused after its reservation";
  auto back = test::read_file(path);
  ASSERT_EQ(back.size(), 8192u + 4096u);
  for (std::size_t i = 8192; i < back.size(); ++i) ASSERT_EQ(back[i], 0x5A) << i;
}

}  // namespace
}  // namespace ferry
