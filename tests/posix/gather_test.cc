// File::pread_gather and File::pread_ranges: many ranges of one file as one request.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "ferry/ferry.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::TempDir;

File open_with(const std::filesystem::path& path, const char* task_size, const char* threads,
               bool direct = false) {
  FileOptions options;
  options.direct = direct;
  options.settings.set("task_size", task_size);
  options.settings.set("host_nthreads", threads);
  return File(path, "r", options);
}

// Ranges of random sizes (some larger than a task, some of 0 bytes, some unaligned, some
// overlapping in the file) land each in its own allocation, and nothing else is written.
void check_random_gather(bool direct, std::uint64_t seed) {
  TempDir dir;
  const std::size_t file_size = 5 * 1024 * 1024 + 777;
  auto data = test::pattern_bytes(file_size, seed);
  test::write_file(dir / "g.bin", data);
  std::mt19937_64 rng(seed);
  for (const char* task : {"4KiB", "256KiB", "4MiB"}) {
    File f = open_with(dir / "g.bin", task, "4", direct);
    std::vector<std::vector<unsigned char>> buffers;
    std::vector<ReadRange> ranges;
    for (int i = 0; i < 40; ++i) {
      const std::size_t size = i % 10 == 0 ? 0 : rng() % (file_size / 8) + 1;
      const std::uint64_t offset = rng() % (file_size - size + 1);
      buffers.emplace_back(size + 32, 0xEE);
      ranges.push_back({offset, size, buffers.back().data() + 16});
    }
    std::uint64_t total = 0;
    for (const ReadRange& r : ranges) total += r.size;
    IoFuture fut = f.pread_gather(ranges);
    ASSERT_EQ(fut.get(), total) << "task " << task;
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const auto& b = buffers[i];
      ASSERT_EQ(0, std::memcmp(b.data() + 16, data.data() + ranges[i].file_offset, ranges[i].size))
          << "range " << i << " task " << task;
      for (std::size_t k = 0; k < 16; ++k) ASSERT_EQ(b[k], 0xEE);
      for (std::size_t k = 16 + ranges[i].size; k < b.size(); ++k) ASSERT_EQ(b[k], 0xEE);
    }
  }
}

TEST(Gather, RandomRangesLandInTheirOwnBuffersBuffered) { check_random_gather(false, 11); }
TEST(Gather, RandomRangesLandInTheirOwnBuffersWithDirectIo) { check_random_gather(true, 12); }

TEST(Gather, OneReportCoversEveryRangeWithTasksCutFromEach) {
  TempDir dir;
  auto data = test::pattern_bytes(3 << 20, 3);
  test::write_file(dir / "g.bin", data);
  File f = open_with(dir / "g.bin", "64KiB", "4");
  std::vector<unsigned char> a(100000), b(64 << 10), c(1);
  std::vector<ReadRange> ranges = {{1000, a.size(), a.data()},
                                   {2 << 20, b.size(), b.data()},
                                   {(3 << 20) - 1, c.size(), c.data()}};
  IoFuture fut = f.pread_gather(ranges);
  EXPECT_EQ(fut.get(), a.size() + b.size() + c.size());
  RouteReport r = fut.route();
  EXPECT_EQ(r.tasks, 2u + 1u + 1u);  // 100000 B is two tasks of at most 64 KiB
  EXPECT_EQ(r.posix_tasks, r.tasks);
  EXPECT_EQ(r.requested, a.size() + b.size() + c.size());
  EXPECT_EQ(r.bytes, r.requested);
  EXPECT_EQ(r.offset, 1000u);  // the lowest offset
  EXPECT_EQ(c[0], data.back());
  EXPECT_EQ(f.last_route().tasks, r.tasks);
}

TEST(Gather, RangePastTheEndIsAnErrorNamingItBeforeAnyIo) {
  TempDir dir;
  test::write_file(dir / "g.bin", test::pattern_bytes(1 << 20, 4));
  File f = open_with(dir / "g.bin", "64KiB", "2");
  std::vector<unsigned char> a(4096, 0xEE), b(8192, 0xEE);
  std::vector<ReadRange> ranges = {{0, a.size(), a.data()}, {(1 << 20) - 100, b.size(), b.data()}};
  const std::string path = (dir / "g.bin").string();
  test::expect_io_error([&] { f.pread_gather(ranges).get(); }, path, ENXIO);
  try {
    f.pread_gather(ranges).get();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("range 1"), std::string::npos) << e.what();
  }
  for (unsigned char x : a) ASSERT_EQ(x, 0xEE);  // nothing was read
}

TEST(Gather, NullBufferIsAnErrorAndNoRangesReadNothing) {
  TempDir dir;
  test::write_file(dir / "g.bin", test::pattern_bytes(1 << 16, 5));
  File f = open_with(dir / "g.bin", "64KiB", "2");
  std::vector<ReadRange> bad = {{0, 10, nullptr}};
  test::expect_io_error([&] { f.pread_gather(bad).get(); }, (dir / "g.bin").string(), EFAULT);
  EXPECT_EQ(f.pread_gather({}).get(), 0u);
  std::vector<ReadRange> empty = {{0, 0, nullptr}};
  EXPECT_EQ(f.pread_gather(empty).get(), 0u);
}

TEST(Gather, TheRangesAreCopiedBeforeTheCallReturns) {
  TempDir dir;
  auto data = test::pattern_bytes(8 << 20, 6);
  test::write_file(dir / "g.bin", data);
  File f = open_with(dir / "g.bin", "64KiB", "2");
  std::vector<unsigned char> a(4 << 20);
  IoFuture fut;
  {
    std::vector<ReadRange> ranges = {{4 << 20, a.size(), a.data()}};
    fut = f.pread_gather(ranges);
    ranges.assign(1, ReadRange{0, 0, nullptr});  // overwritten while the request runs
  }
  EXPECT_EQ(fut.get(), a.size());
  EXPECT_EQ(0, std::memcmp(a.data(), data.data() + (4 << 20), a.size()));
}

// pread_ranges: rows of one file into one buffer, adjacent ones coalesced into runs.
TEST(Ranges, RowsLandAtTheirBufferOffsetsAndAdjacentOnesCoalesce) {
  TempDir dir;
  const std::size_t row = 4096;
  auto data = test::pattern_bytes(1024 * row, 21);
  test::write_file(dir / "rows.bin", data);
  File f = open_with(dir / "rows.bin", "64KiB", "4");
  // Rows 10..13 in order into slots 0..3 (one run), then rows 500, 7 and 900 scattered.
  std::vector<ByteRange> ranges;
  for (std::size_t i = 0; i < 4; ++i) ranges.push_back({(10 + i) * row, row, i * row});
  ranges.push_back({500 * row, row, 4 * row});
  ranges.push_back({7 * row, row, 5 * row});
  ranges.push_back({900 * row + 100, row - 200, 6 * row + 100});
  std::vector<unsigned char> buf(8 * row, 0xEE);
  IoFuture fut = f.pread_ranges(buf.data(), buf.size(), ranges);
  EXPECT_EQ(fut.get(), 6 * row + row - 200);
  for (const ByteRange& r : ranges) {
    ASSERT_EQ(0, std::memcmp(buf.data() + r.buffer_offset, data.data() + r.file_offset, r.size));
  }
  for (std::size_t i = 6 * row; i < 6 * row + 100; ++i) ASSERT_EQ(buf[i], 0xEE);
  for (std::size_t i = 7 * row - 100; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0xEE);
  RouteReport r = fut.route();
  EXPECT_EQ(r.ranges, 7u);
  EXPECT_EQ(r.runs, 4u);  // the first four rows are one run
  EXPECT_EQ(r.tasks, 4u);
  EXPECT_NE(r.to_text().find("7 range(s) in 4 run(s)"), std::string::npos) << r.to_text();
  EXPECT_NE(r.to_json().find("\"runs\":4"), std::string::npos) << r.to_json();
}

TEST(Ranges, ARangeOutsideTheBufferIsAnErrorNamingItBeforeAnyIo) {
  TempDir dir;
  test::write_file(dir / "rows.bin", test::pattern_bytes(1 << 20, 22));
  File f = open_with(dir / "rows.bin", "64KiB", "2");
  std::vector<unsigned char> buf(8192, 0xEE);
  std::vector<ByteRange> ranges = {{0, 4096, 0}, {4096, 4096, 4097}};
  try {
    f.pread_ranges(buf.data(), buf.size(), ranges).get();
    FAIL() << "a range past the buffer was read";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EINVAL);
    EXPECT_NE(std::string(e.what()).find("range 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("outside the buffer of 8192 B"), std::string::npos)
        << e.what();
  }
  for (unsigned char x : buf) ASSERT_EQ(x, 0xEE);
  std::vector<ByteRange> past_the_end = {{(1 << 20) - 10, 100, 0}};
  test::expect_io_error([&] { f.pread_ranges(buf.data(), buf.size(), past_the_end).get(); },
                        (dir / "rows.bin").string(), ENXIO);
}

// Many random 4 KiB rows, as an embedding lookup makes them, against a pread per row.
TEST(Ranges, TenThousandRandomRowsMatchAPreadPerRow) {
  TempDir dir;
  const std::size_t row = 4096, rows = 4096;
  auto data = test::pattern_bytes(rows * row, 23);
  test::write_file(dir / "rows.bin", data);
  File f(dir / "rows.bin");
  std::mt19937_64 rng(24);
  std::vector<ByteRange> ranges;
  for (std::size_t i = 0; i < 10000; ++i) ranges.push_back({rng() % rows * row, row, i * row});
  std::vector<unsigned char> buf(ranges.size() * row);
  EXPECT_EQ(f.pread_ranges(buf.data(), buf.size(), ranges).get(), buf.size());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(buf.data() + i * row, data.data() + ranges[i].file_offset, row)) << i;
  }
}

}  // namespace
}  // namespace ferry
