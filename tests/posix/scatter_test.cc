// File::pwrite_scatter and File::pwrite_ranges: many ranges written as one request.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "ferry/ferry.h"
#include "scripted_io.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::TempDir;

File open_for_writing(const std::filesystem::path& path, const char* mode, const char* task_size,
                      bool direct = false) {
  FileOptions options;
  options.direct = direct;
  options.settings.set("task_size", task_size);
  options.settings.set("host_nthreads", "4");
  return File(path, mode, options);
}

// Disjoint ranges of random sizes (some larger than a task, some of 0 bytes, some unaligned),
// each from its own allocation, in random order, with holes between them: every range lands at
// its offset, the holes stay as they were, and the file ends where the last range ends.
void check_random_scatter(bool direct, std::uint64_t seed) {
  TempDir dir;
  std::mt19937_64 rng(seed);
  for (const char* task : {"4KiB", "256KiB", "4MiB"}) {
    const auto path = dir / "s.bin";
    const std::vector<unsigned char> before = test::pattern_bytes(1 << 20, seed + 1);
    test::write_file(path, before);
    // Cut [0, 6 MiB) into pieces; keep two of three as ranges, the third as a hole.
    std::vector<std::pair<std::uint64_t, std::size_t>> pieces;
    for (std::uint64_t at = 0; at < (6u << 20);) {
      const std::size_t size = rng() % 10 == 0 ? 0 : rng() % (700 << 10) + 1;
      pieces.push_back({at, size});
      at += size + rng() % 5000;
    }
    std::vector<std::vector<unsigned char>> buffers;
    std::vector<WriteRange> ranges;
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      if (i % 3 == 2) continue;
      buffers.push_back(test::pattern_bytes(pieces[i].second, seed * 1000 + i));
      ranges.push_back({pieces[i].first, pieces[i].second, buffers.back().data()});
    }
    std::vector<std::size_t> order(ranges.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<WriteRange> shuffled;
    for (std::size_t k : order) shuffled.push_back(ranges[k]);
    std::uint64_t total = 0;
    std::uint64_t end = before.size();
    std::vector<unsigned char> expected = before;
    for (const WriteRange& r : ranges) {
      total += r.size;
      if (r.size == 0) continue;
      end = std::max<std::uint64_t>(end, r.file_offset + r.size);
      expected.resize(std::max<std::size_t>(expected.size(), r.file_offset + r.size), 0);
      std::memcpy(expected.data() + r.file_offset, r.buffer, r.size);
    }
    File f = open_for_writing(path, "r+", task, direct);
    IoFuture fut = f.pwrite_scatter(shuffled);
    ASSERT_EQ(fut.get(), total) << "task " << task;
    f.close();
    const auto after = test::read_file(path);
    ASSERT_EQ(after.size(), end) << "task " << task;
    ASSERT_TRUE(after == expected) << "task " << task;
  }
}

TEST(Scatter, RandomRangesLandAtTheirOffsetsAndTheHolesKeepTheirBytes) {
  check_random_scatter(false, 31);
}
TEST(Scatter, RandomRangesLandAtTheirOffsetsWithDirectIo) { check_random_scatter(true, 32); }

TEST(Scatter, OneReportCoversEveryRangeWithTasksCutFromEach) {
  TempDir dir;
  std::vector<unsigned char> a(10000, 1), b(300000, 2), c(1, 3);
  const WriteRange ranges[] = {
      {0, a.size(), a.data()}, {50000, b.size(), b.data()}, {1 << 20, c.size(), c.data()}};
  File f = open_for_writing(dir / "r.bin", "w", "64KiB");
  ASSERT_EQ(f.pwrite_scatter(ranges).get(), a.size() + b.size() + c.size());
  const RouteReport r = f.last_route();
  EXPECT_EQ(r.op, Op::kWrite);
  EXPECT_EQ(r.ranges, 3u);
  EXPECT_EQ(r.runs, 3u);
  EXPECT_EQ(r.tasks, 1u + 5u + 1u);  // 300000 B in 64 KiB tasks: 5
  EXPECT_EQ(r.bytes, a.size() + b.size() + c.size());
  EXPECT_EQ(r.offset, 0u);
  f.close();
  const auto bytes = test::read_file(dir / "r.bin");
  ASSERT_EQ(bytes.size(), (1u << 20) + 1);
  EXPECT_EQ(bytes[9999], 1);
  EXPECT_EQ(bytes[10000], 0) << "a hole reads as zeros";
  EXPECT_EQ(bytes[50000], 2);
  EXPECT_EQ(bytes[1 << 20], 3);
}

TEST(Scatter, OverlappingRangesAreAnErrorNamingThemBeforeAnyIo) {
  TempDir dir;
  const auto path = dir / "o.bin";
  const auto before = test::pattern_bytes(100000, 33);
  test::write_file(path, before);
  std::vector<unsigned char> data(40000, 0x77);
  const WriteRange ranges[] = {{0, 1000, data.data()},
                               {60000, 30000, data.data()},
                               {5000, 100, data.data()},
                               {89999, 5, data.data()}};  // overlaps range 1's last byte
  File f = open_for_writing(path, "r+", "4KiB");
  try {
    f.pwrite_scatter(ranges).get();
    FAIL() << "overlapping ranges were written";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EINVAL);
    EXPECT_EQ(e.op(), "pwrite_scatter");
    EXPECT_EQ(e.bytes_done(), 0u);
    EXPECT_NE(std::string(e.what()).find("range 1 (file bytes [60000, 90000)) overlaps range 3 "
                                         "([89999, 90004))"),
              std::string::npos)
        << e.what();
  }
  f.close();
  EXPECT_TRUE(test::read_file(path) == before) << "nothing was written";
}

TEST(Scatter, ARangeOutsideTheBufferOrAppendModeIsAnErrorBeforeAnyIo) {
  TempDir dir;
  const auto path = dir / "b.bin";
  test::write_file(path, test::pattern_bytes(4096, 34));
  std::vector<unsigned char> data(1000, 5);
  {
    File f = open_for_writing(path, "r+", "4KiB");
    const ByteRange ranges[] = {{0, 500, 0}, {600, 600, 500}};  // 500 + 600 > 1000
    try {
      f.pwrite_ranges(data.data(), data.size(), ranges);
      FAIL() << "a range outside the buffer was accepted";
    } catch (const IoError& e) {
      EXPECT_EQ(e.error_code(), EINVAL);
      EXPECT_NE(std::string(e.what()).find("range 1 is buffer bytes [500, 1100), outside the "
                                           "buffer of 1000 B"),
                std::string::npos)
          << e.what();
    }
  }
  {
    File f = open_for_writing(path, "a", "4KiB");
    const WriteRange ranges[] = {{0, 10, data.data()}};
    try {
      f.pwrite_scatter(ranges);
      FAIL() << "a scattered write was accepted in append mode";
    } catch (const IoError& e) {
      EXPECT_EQ(e.error_code(), EBADF);
      EXPECT_NE(std::string(e.what()).find("not in append mode"), std::string::npos) << e.what();
    }
  }
  {
    File f(path, "r");
    const WriteRange ranges[] = {{0, 10, data.data()}};
    try {
      f.pwrite_scatter(ranges).get();
      FAIL() << "a scattered write went to a file opened for reading";
    } catch (const IoError& e) {
      EXPECT_EQ(e.error_code(), EBADF);
    }
  }
  EXPECT_EQ(test::read_file(path), test::pattern_bytes(4096, 34));
}

TEST(Scatter, RowsFromOneBufferCoalesceWhereAdjacentInBoth) {
  TempDir dir;
  auto src = test::pattern_bytes(8 * 4096, 35);
  // Rows 0..3 adjacent in both (one run), row 4 adjacent in the file only, row 5 in neither.
  const ByteRange ranges[] = {{0, 4096, 0},         {4096, 4096, 4096},   {8192, 4096, 8192},
                              {12288, 4096, 12288}, {16384, 4096, 24576}, {40960, 4096, 16384}};
  File f = open_for_writing(dir / "rows.bin", "w", "1MiB");
  ASSERT_EQ(f.pwrite_ranges(src.data(), src.size(), ranges).get(), 6u * 4096);
  EXPECT_EQ(f.last_route().ranges, 6u);
  EXPECT_EQ(f.last_route().runs, 3u);
  f.close();
  const auto bytes = test::read_file(dir / "rows.bin");
  ASSERT_EQ(bytes.size(), 40960u + 4096);
  for (const ByteRange& r : ranges) {
    EXPECT_EQ(0, std::memcmp(bytes.data() + r.file_offset, src.data() + r.buffer_offset, r.size))
        << "row at " << r.file_offset;
  }
}

// A failure partway: the error names the file and the failing range's bytes, and bytes_done
// counts the ranges in the order given up to the first byte not known to be in the file, all of
// which are.
TEST(Scatter, AFailedWriteReportsThePrefixOfTheRangesThatReachedTheFile) {
  TempDir dir;
  const auto path = dir / "fail.bin";
  test::ScriptedIo io;
  io.fail_offset = (3 << 20) + 100;  // inside the fourth range
  io.fail_errno = ENOSPC;
  File f = test::open_scripted(io, path, "w", "256KiB", "1");
  std::vector<std::vector<unsigned char>> buffers;
  std::vector<WriteRange> ranges;
  for (int i = 0; i < 6; ++i) {
    buffers.push_back(test::pattern_bytes(1 << 20, 40 + i));
    ranges.push_back({static_cast<std::uint64_t>(i) << 20, 1u << 20, buffers.back().data()});
  }
  try {
    f.pwrite_scatter(ranges).get();
    FAIL() << "the write reported success despite ENOSPC";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), ENOSPC);
    EXPECT_EQ(e.path(), path.string());
    EXPECT_EQ(e.bytes_done(), 3u << 20) << e.what();
    const auto bytes = test::read_file(path);
    ASSERT_GE(bytes.size(), e.bytes_done());
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(0, std::memcmp(bytes.data() + (static_cast<std::size_t>(i) << 20),
                               buffers[i].data(), 1 << 20))
          << "range " << i;
    }
  }
}

}  // namespace
}  // namespace ferry
