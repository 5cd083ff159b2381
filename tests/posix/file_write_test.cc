#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ferry/ferry.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::TempDir;

void check_writes_read_back(bool direct) {
  TempDir dir;
  const std::size_t size = 2 * 1024 * 1024 + 777;
  auto data = test::random_bytes(size, 11);
  std::mt19937_64 rng(direct ? 12 : 13);
  for (const char* task : {"4KiB", "100000", "1MiB"}) {
    FileOptions options;
    options.direct = direct;
    options.settings.set("task_size", task);
    options.settings.set("bounce_buffer_size", "64KiB");
    auto path = dir / "w.bin";
    {
      File file(path, "w", options);
      EXPECT_EQ(file.write(data.data(), size, 0), size);
    }
    EXPECT_EQ(test::read_file(path), data) << "task " << task;
    // Overwrite random unaligned ranges from unaligned sources and compare with a model.
    std::vector<unsigned char> model = data;
    File file(path, "r+", options);
    for (int i = 0; i < 10; ++i) {
      std::uint64_t off = rng() % size;
      std::size_t len = rng() % (size - off) + 1;
      auto patch = test::random_bytes(len + 3, rng());
      EXPECT_EQ(file.write(patch.data() + 3, len, off), len);
      std::memcpy(model.data() + off, patch.data() + 3, len);
    }
    file.sync();
    EXPECT_EQ(test::read_file(path), model) << "task " << task << " direct " << direct;
  }
}

TEST(FileWrite, WritesReadBackBuffered) { check_writes_read_back(false); }
TEST(FileWrite, WritesReadBackWithDirectIoAndUnalignedHeadAndTail) { check_writes_read_back(true); }

TEST(FileWrite, WritePastEndExtendsTheFile) {
  TempDir dir;
  File file(dir / "x.bin", "w+");
  auto data = test::random_bytes(5000, 14);
  EXPECT_EQ(file.write(data.data(), data.size(), 10000), data.size());
  EXPECT_EQ(file.size(), 15000u);
  std::vector<unsigned char> back(5000);
  EXPECT_EQ(file.read(back.data(), back.size(), 10000), 5000u);
  EXPECT_EQ(back, data);
}

TEST(FileWrite, AppendWritesAtTheEnd) {
  TempDir dir;
  test::write_file(dir / "a.bin", {1, 2, 3});
  File file(dir / "a.bin", "a");
  unsigned char more[] = {4, 5};
  EXPECT_EQ(file.append(more, 2), 2u);
  EXPECT_EQ(test::read_file(dir / "a.bin"), (std::vector<unsigned char>{1, 2, 3, 4, 5}));
}

TEST(FileWrite, ModeWTruncatesAndModeRPlusKeeps) {
  TempDir dir;
  test::write_file(dir / "m.bin", {9, 9, 9, 9});
  { File keep(dir / "m.bin", "r+"); }
  EXPECT_EQ(test::read_file(dir / "m.bin").size(), 4u);
  { File trunc(dir / "m.bin", "w"); }
  EXPECT_EQ(test::read_file(dir / "m.bin").size(), 0u);
}

TEST(FileWrite, RouteReportCountsWrittenBytes) {
  TempDir dir;
  File file(dir / "r.bin", "w");
  auto data = test::random_bytes(1 << 20, 15);
  IoFuture f = file.pwrite(data.data(), data.size(), 0);
  EXPECT_EQ(f.get(), data.size());
  EXPECT_EQ(f.route().op, Op::kWrite);
  EXPECT_EQ(f.route().bytes, data.size());
}

}  // namespace
}  // namespace ferry
