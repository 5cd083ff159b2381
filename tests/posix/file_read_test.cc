#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/vfs.h>

#include <cstring>
#include <random>
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

// Reads random ranges (unaligned, crossing end of file) through ferry and compares each byte
// with the file's content, for several task sizes and thread counts.
void check_random_ranges(bool direct, std::uint64_t seed) {
  TempDir dir;
  const std::size_t file_size = 3 * 1024 * 1024 + 12345;
  auto data = test::random_bytes(file_size, seed);
  test::write_file(dir / "data.bin", data);
  std::mt19937_64 rng(seed);
  for (const char* task : {"4KiB", "64KiB", "1MiB", "4MiB"}) {
    for (const char* threads : {"1", "3", "8"}) {
      FileOptions options;
      options.direct = direct;
      options.settings.set("task_size", task);
      options.settings.set("nthreads", threads);
      options.settings.set("bounce_buffer_size", "64KiB");
      File file(dir / "data.bin", "r", options);
      for (int i = 0; i < 8; ++i) {
        std::uint64_t offset = rng() % (file_size + 100);
        std::size_t size = rng() % (file_size / 2) + 1;
        std::size_t buffer_offset = rng() % 64;
        std::vector<unsigned char> buffer(size + buffer_offset + 16, 0xEE);
        std::size_t got = file.read(buffer.data() + buffer_offset, size, offset);
        std::size_t expected =
            offset >= file_size ? 0 : std::min<std::uint64_t>(size, file_size - offset);
        ASSERT_EQ(got, expected) << "offset " << offset << " size " << size << " task " << task;
        ASSERT_EQ(0, std::memcmp(buffer.data() + buffer_offset,
                                 data.data() + std::min<std::uint64_t>(offset, file_size), got))
            << "offset " << offset << " size " << size << " task " << task << " threads "
            << threads;
        // Nothing written outside the requested range.
        for (std::size_t b = 0; b < buffer_offset; ++b) ASSERT_EQ(buffer[b], 0xEE);
        for (std::size_t b = buffer_offset + got; b < buffer.size(); ++b)
          ASSERT_EQ(buffer[b], 0xEE);
      }
    }
  }
}

TEST(FileRead, RandomRangesMatchTheFileBuffered) { check_random_ranges(false, 1); }
TEST(FileRead, RandomRangesMatchTheFileWithDirectIo) { check_random_ranges(true, 2); }

TEST(FileRead, RouteReportCountsTasksAndSaysPosix) {
  TempDir dir;
  test::write_file(dir / "a.bin", test::random_bytes(10 << 20, 3));
  FileOptions options;
  options.settings.set("task_size", "4MiB");
  File file(dir / "a.bin", "r", options);
  std::vector<unsigned char> buffer(10 << 20);
  IoFuture f = file.pread(buffer.data(), buffer.size(), 0);
  EXPECT_EQ(f.get(), buffer.size());
  RouteReport r = f.route();
  EXPECT_EQ(r.tasks, 3u);
  EXPECT_EQ(r.posix_tasks, 3u);
  EXPECT_EQ(r.cufile_tasks, 0u);
  EXPECT_EQ(r.bytes, buffer.size());
  EXPECT_EQ(r.memory, MemoryKind::kHostPageable);
  EXPECT_FALSE(r.verdict().empty());
  EXPECT_NE(r.to_json().find("\"posix_tasks\":3"), std::string::npos) << r.to_json();
  EXPECT_EQ(file.last_route().bytes, buffer.size());
}

// A small request's future keeps its File's path for its report: inline up to 160 bytes, in a
// string beyond (the second path is exactly 160 bytes). Each names the file, after the File is
// gone too.
TEST(FileRead, SmallFutureReportNamesItsFileWhateverThePathLength) {
  TempDir dir;
  const std::filesystem::path deep = dir / std::string(100, 'd') / std::string(100, 'e');
  std::filesystem::create_directories(deep);
  for (const std::filesystem::path& path :
       {dir / "a.bin", dir / std::string(159 - dir.path().string().size(), 'p'), deep / "b.bin"}) {
    test::write_file(path, test::random_bytes(8192, 4));
    std::vector<unsigned char> buffer(4096);
    IoFuture f;
    {
      File file(path, "r");
      f = file.pread(buffer.data(), buffer.size(), 4096);
      EXPECT_EQ(file.last_route().file, path.string());
    }
    EXPECT_EQ(f.get(), buffer.size());
    RouteReport r = f.route();
    EXPECT_EQ(r.file, path.string()) << path.string().size() << " bytes";
    EXPECT_EQ(r.bytes, buffer.size());
  }
}

TEST(FileRead, ManyConcurrentPreadsOnOneFile) {
  TempDir dir;
  const std::size_t size = 8 << 20;
  auto data = test::random_bytes(size, 4);
  test::write_file(dir / "c.bin", data);
  FileOptions options;
  options.settings.set("task_size", "256KiB");
  File file(dir / "c.bin", "r", options);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 20; ++i) {
        std::uint64_t off = rng() % size;
        std::size_t len = rng() % (2 << 20) + 1;
        std::vector<unsigned char> buf(len);
        IoFuture a = file.pread(buf.data(), len, off);
        std::size_t got = a.get();
        if (got != std::min<std::uint64_t>(len, size - off) ||
            std::memcmp(buf.data(), data.data() + off, got) != 0) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(FileRead, OffsetPastEndOfFileReadsNothing) {
  TempDir dir;
  test::write_file(dir / "s.bin", test::random_bytes(100, 5));
  File file(dir / "s.bin");
  char buf[10];
  EXPECT_EQ(file.read(buf, sizeof buf, 1000), 0u);
  EXPECT_EQ(file.read(buf, sizeof buf, 100), 0u);
  EXPECT_EQ(file.read(buf, sizeof buf, 95), 5u);
}

TEST(FileRead, ZeroSizeReadReturnsZeroWithoutTouchingTheBuffer) {
  TempDir dir;
  test::write_file(dir / "z.bin", test::random_bytes(100, 6));
  File file(dir / "z.bin");
  EXPECT_EQ(file.read(nullptr, 0, 0), 0u);
  EXPECT_EQ(file.last_route().tasks, 0u);
}

void expect_direct_refused(File& file, const std::vector<unsigned char>& data) {
  std::vector<unsigned char> buf(data.size());
  IoFuture f = file.pread(buf.data(), buf.size(), 0);
  ASSERT_EQ(f.get(), data.size());
  EXPECT_EQ(buf, data);
  RouteReport r = f.route();
  EXPECT_FALSE(r.direct);
  bool found = false;
  for (const RouteReason& reason : r.reasons) {
    if (reason.code == ReasonCode::kDirectIoRefused) {
      found = true;
      EXPECT_NE(reason.text.find("O_DIRECT refused"), std::string::npos) << reason.text;
      EXPECT_NE(reason.text.find(file.path()), std::string::npos) << reason.text;
    }
  }
  EXPECT_TRUE(found);
}

// A file system that refuses O_DIRECT, as tmpfs did before Linux 6.6, through the I/O seam.
class NoDirectIo final : public test::PassThroughIo {
 public:
  int open(const char* path, int flags, mode_t mode) override {
    if (flags & O_DIRECT) {
      errno = EINVAL;
      return -1;
    }
    return io::system_io().open(path, flags, mode);
  }
};

TEST(FileRead, DirectIoRefusedByTheFileSystemFallsBackToBufferedWithAReason) {
  TempDir dir;
  auto data = test::random_bytes(1 << 20, 7);
  test::write_file(dir / "t.bin", data);
  NoDirectIo io;
  File file = test::FileTestHelper::open(dir / "t.bin", "r", FileOptions{true, {}}, io);
  expect_direct_refused(file, data);
}

TEST(FileRead, DirectIoOnTmpfsFallsBackWhereTheKernelRefusesIt) {
  struct statfs fs {};
  if (statfs("/dev/shm", &fs) != 0 || fs.f_type != 0x01021994 /* TMPFS_MAGIC */) {
    GTEST_SKIP() << "/dev/shm is not a tmpfs on this machine";
  }
  TempDir dir("/dev/shm");
  auto data = test::random_bytes(1 << 20, 7);
  test::write_file(dir / "t.bin", data);
  int probe = ::open((dir / "t.bin").c_str(), O_RDONLY | O_DIRECT);
  if (probe >= 0) {
    ::close(probe);
    GTEST_SKIP() << "this kernel's tmpfs accepts O_DIRECT (Linux 6.6 and later)";
  }
  File file(dir / "t.bin", "r", FileOptions{true, {}});
  expect_direct_refused(file, data);
}

TEST(FileRead, StatsCountRequestsAndBytes) {
  TempDir dir;
  test::write_file(dir / "st.bin", test::random_bytes(1 << 20, 8));
  reset_stats();
  File file(dir / "st.bin");
  std::vector<unsigned char> buf(1 << 20);
  file.read(buf.data(), buf.size(), 0);
  file.read(buf.data(), 10, 0);
  Stats s = stats();
  EXPECT_EQ(s.requests, 2u);
  EXPECT_EQ(s.bytes_read, (1u << 20) + 10);
  EXPECT_EQ(s.failed_requests, 0u);
  EXPECT_GE(s.posix_tasks, 2u);
  // Each request records one routing reason: host buffer, or no driver at all on this machine.
  EXPECT_EQ(s.reasons["host_buffer"] + s.reasons["no_cuda_driver"], 2u);
  reset_stats();
  EXPECT_EQ(stats().requests, 0u);
}

}  // namespace
}  // namespace ferry
