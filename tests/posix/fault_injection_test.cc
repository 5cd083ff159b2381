// Faults injected at the POSIX backend's I/O seam: retries of EINTR/EAGAIN and short transfers,
// and errors that must name the file and offset and never look like success.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/open_file.h"
#include "ferry/ferry.h"
#include "io/io_seam.h"
#include "pass_through_io.h"
#include "test_hooks.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::TempDir;

// Passes calls to the real system, except the faults it was told to inject.
class FaultyIo final : public test::PassThroughIo {
 public:
  std::atomic<int> eintr_left{0};            // the next N preads/pwrites fail with EINTR
  std::atomic<bool> short_transfers{false};  // every transfer moves at most 1000 bytes
  std::int64_t fail_offset = -1;  // a transfer covering this offset fails with `fail_errno`
  int fail_errno = EIO;
  std::atomic<int> delay_us{0};  // every call that does not fail waits this long first
  std::atomic<int> calls{0};

  ssize_t pread(int fd, void* buf, size_t size, off_t offset) override {
    if (ssize_t r = fault(size, offset); r != 0) return r;
    return io::system_io().pread(fd, buf, short_transfers ? std::min<size_t>(size, 1000) : size,
                                 offset);
  }
  ssize_t pwrite(int fd, const void* buf, size_t size, off_t offset) override {
    if (ssize_t r = fault(size, offset); r != 0) return r;
    return io::system_io().pwrite(fd, buf, short_transfers ? std::min<size_t>(size, 1000) : size,
                                  offset);
  }

 private:
  ssize_t fault(size_t size, off_t offset) {
    calls.fetch_add(1);
    if (eintr_left.fetch_sub(1) > 0) {
      errno = EINTR;
      return -1;
    }
    if (fail_offset >= offset && fail_offset < offset + static_cast<off_t>(size)) {
      errno = fail_errno;
      return -1;
    }
    if (delay_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    return 0;
  }
};

File open_with(FaultyIo& io, const std::filesystem::path& path, const char* mode,
               const char* task = "64KiB") {
  FileOptions options;
  options.settings.set("task_size", task);
  options.settings.set("nthreads", "4");
  return test::FileTestHelper::open(path, mode, options, io);
}

TEST(FaultInjection, EintrAndShortReadsAreRetriedToTheFullCount) {
  TempDir dir;
  auto data = test::random_bytes(300000, 31);
  test::write_file(dir / "f.bin", data);
  FaultyIo io;
  io.eintr_left = 5;
  io.short_transfers = true;
  File f = open_with(io, dir / "f.bin", "r");
  std::vector<unsigned char> buf(data.size());
  EXPECT_EQ(f.read(buf.data(), buf.size(), 0), data.size());
  EXPECT_EQ(buf, data);
}

TEST(FaultInjection, EioOnReadNamesFileOffsetAndLength) {
  TempDir dir;
  auto path = (dir / "eio.bin").string();
  test::write_file(path, test::random_bytes(1 << 20, 32));
  FaultyIo io;
  io.fail_offset = 600000;
  File f = open_with(io, path, "r");
  std::vector<unsigned char> buf(1 << 20);
  try {
    f.read(buf.data(), buf.size(), 0);
    FAIL() << "read reported success despite EIO";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EIO);
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.op(), "pread");
    EXPECT_LE(e.offset(), 600000u);
    EXPECT_GT(e.offset() + e.length(), 600000u);
    std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos);
    EXPECT_NE(what.find("offset="), std::string::npos);
    EXPECT_NE(what.find("Input/output error"), std::string::npos) << what;
  }
  // The pool and the file stay usable.
  io.fail_offset = -1;
  EXPECT_EQ(f.read(buf.data(), buf.size(), 0), buf.size());
}

TEST(FaultInjection, EnospcOnWriteReportsBytesWrittenAndNeverSuccess) {
  TempDir dir;
  auto path = (dir / "full.bin").string();
  FaultyIo io;
  io.fail_offset = 500000;
  io.fail_errno = ENOSPC;
  File f = open_with(io, path, "w");
  auto data = test::random_bytes(1 << 20, 33);
  try {
    f.write(data.data(), data.size(), 0);
    FAIL() << "write reported success despite ENOSPC";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), ENOSPC);
    EXPECT_EQ(e.op(), "pwrite");
    EXPECT_LT(e.bytes_done(), data.size());
    EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos);
  }
  Stats s = stats();
  EXPECT_GE(s.failed_requests, 1u);
}

TEST(FaultInjection, ShortWritesAreContinued) {
  TempDir dir;
  auto path = dir / "short.bin";
  FaultyIo io;
  io.short_transfers = true;
  io.eintr_left = 3;
  auto data = test::random_bytes(250000, 34);
  {
    File f = open_with(io, path, "w");
    EXPECT_EQ(f.write(data.data(), data.size(), 0), data.size());
  }
  EXPECT_EQ(test::read_file(path), data);
}

TEST(FaultInjection, FailedRequestStopsTheOtherTasksPromptly) {
  TempDir dir;
  auto path = dir / "stop.bin";
  test::write_file(path, test::random_bytes(8 << 20, 35));
  FaultyIo io;
  io.fail_offset = 0;  // the very first task fails
  io.delay_us = 2000;  // the others are slow, so stopping them early is visible
  File f = open_with(io, path, "r", "4KiB");
  std::vector<unsigned char> buf(8 << 20);
  EXPECT_THROW(f.read(buf.data(), buf.size(), 0), IoError);
  // 2048 tasks of 4 KiB: after the failure the other workers stop instead of running them all
  // (about 4 seconds of 2 ms calls on 3 workers).
  EXPECT_LT(io.calls.load(), 512);
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

// Regression for the gap docs/reliability.md recorded: close() during a request closed the
// request's descriptor under it. close() now waits for the request and refuses new ones.
TEST(FaultInjection, CloseWaitsForRequestsInFlightAndThenRefusesNewOnes) {
  TempDir dir;
  auto path = dir / "inflight.bin";
  auto data = test::random_bytes(1 << 20, 36);
  test::write_file(path, data);
  FaultyIo io;
  io.delay_us = 2000;  // 256 tasks of 4 KiB on 4 workers: about 130 ms of reading
  File f = open_with(io, path, "r", "4KiB");
  std::vector<unsigned char> buf(data.size());
  IoFuture pending = f.pread(buf.data(), buf.size(), 0);
  f.close();  // must wait for the read's I/O, not pull its descriptor away
  const int calls_at_close = io.calls.load();
  EXPECT_EQ(pending.get(), data.size());
  EXPECT_EQ(io.calls.load(), calls_at_close) << "I/O ran after close() returned";
  EXPECT_EQ(buf, data);
  EXPECT_THROW(f.read(buf.data(), 1, 0), IoError);
}

// Small requests run in their caller's thread and count in that thread's lane of the File, not
// in its shared counter (open_file.h): close() must wait for them in every lane, threads beyond
// the number of lanes sharing one included.
TEST(FaultInjection, CloseWaitsForSmallRequestsInFlightInEveryThread) {
  TempDir dir;
  auto path = dir / "small.bin";
  auto data = test::random_bytes(1 << 20, 37);
  test::write_file(path, data);
  FaultyIo io;
  io.delay_us = 3000;
  File f = open_with(io, path, "r");
  const int calls_before = io.calls.load();  // before any thread can read
  constexpr int kThreads = 24;               // more threads than lanes
  std::atomic<int> started{0};
  std::atomic<int> completed{0};
  std::atomic<int> unexpected{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<unsigned char> buf(4096);
      const std::uint64_t off = static_cast<std::uint64_t>(t) * 4096;
      ++started;
      try {
        // The synchronous form and the futures form: both take the small path.
        const std::size_t n = t % 2 == 0 ? f.read(buf.data(), buf.size(), off)
                                         : f.pread(buf.data(), buf.size(), off).get();
        ++completed;
        if (n != buf.size() || std::memcmp(buf.data(), data.data() + off, n) != 0) ++unexpected;
      } catch (const IoError& e) {
        if (e.error_code() != EBADF) ++unexpected;  // refused: it began after the close
      }
    });
  }
  while (started.load() < kThreads) std::this_thread::yield();
  // At least one read inside its (3 ms) I/O, and most of them soon after: under a sanitizer on a
  // busy 2-core machine, 1 ms alone could pass before any thread reached its read.
  while (io.calls.load() == calls_before) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
  f.close();  // must wait for every read whose I/O began
  const int calls_at_close = io.calls.load();
  for (auto& th : threads) th.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_EQ(io.calls.load(), calls_at_close) << "I/O ran after close() returned";
  EXPECT_GT(completed.load(), 0) << "no read was in flight at the close";
  std::vector<unsigned char> buf(16);
  EXPECT_THROW(f.read(buf.data(), buf.size(), 0), IoError);
}

// Each thread's small requests keep their route in that thread's lane: the File reports the
// request that ended last, whichever thread ran it, and whether it was small or not.
TEST(FaultInjection, LastRouteIsTheRequestThatEndedLastWhicheverThreadRanIt) {
  TempDir dir;
  auto path = dir / "routes.bin";
  auto data = test::random_bytes(4 << 20, 38);
  test::write_file(path, data);
  FaultyIo io;
  File f = open_with(io, path, "r");
  std::vector<unsigned char> buf(1 << 20);
  std::vector<std::thread> threads;
  for (int t = 0; t < 20; ++t) {
    threads.emplace_back([&, t] {
      std::vector<unsigned char> mine(4096);
      for (int i = 0; i < 50; ++i) f.read(mine.data(), mine.size(), 4096 * (t + 1));
    });
  }
  for (auto& th : threads) th.join();
  f.read(buf.data(), 100, 12345);  // small, in this thread, after every other thread's
  RouteReport r = f.last_route();
  EXPECT_EQ(r.offset, 12345u);
  EXPECT_EQ(r.requested, 100u);
  std::thread([&] { f.read(buf.data(), 200, 777); }).join();  // small, in another thread
  r = f.last_route();
  EXPECT_EQ(r.offset, 777u);
  EXPECT_EQ(r.requested, 200u);
  EXPECT_EQ(f.read(buf.data(), buf.size(), 0), buf.size());  // 16 tasks: not a small request
  r = f.last_route();
  EXPECT_EQ(r.offset, 0u);
  EXPECT_EQ(r.requested, buf.size());
  EXPECT_EQ(r.tasks, 16u);
  f.read(buf.data(), 300, 999);  // small again: newer than the big one
  EXPECT_EQ(f.last_route().offset, 999u);
}

class FailingClose final : public test::PassThroughIo {
 public:
  int close(int fd) override {
    io::system_io().close(fd);
    errno = EIO;  // as NFS reports a write that failed to reach the server
    return -1;
  }
};

TEST(FaultInjection, CloseReportsAFailedCloseNamingTheFile) {
  TempDir dir;
  auto path = (dir / "nfs.bin").string();
  FailingClose io;
  File f = test::FileTestHelper::open(path, "w", FileOptions{}, io);
  unsigned char b[4] = {1, 2, 3, 4};
  f.write(b, 4, 0);
  test::expect_io_error([&] { f.close(); }, path, EIO);
  EXPECT_FALSE(f.is_open());
}

}  // namespace
}  // namespace ferry
