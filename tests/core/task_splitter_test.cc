#include "core/task_splitter.h"

#include <gtest/gtest.h>

namespace ferry::core {
namespace {

TEST(TaskSplitter, OneGibInFourMibTasksGivesTwoHundredFiftySix) {
  TaskSplitter t(0, std::size_t{1} << 30, std::size_t{4} << 20);
  EXPECT_EQ(t.count(), 256u);
  EXPECT_EQ(t[255].file_offset, (std::uint64_t{1} << 30) - (4u << 20));
  EXPECT_EQ(t[255].size, 4u << 20);
}

TEST(TaskSplitter, LastTaskStopsAtEndOfRequest) {
  TaskSplitter t(100, 10, 4);
  ASSERT_EQ(t.count(), 3u);
  EXPECT_EQ(t[0].file_offset, 100u);
  EXPECT_EQ(t[0].buffer_offset, 0u);
  EXPECT_EQ(t[2].file_offset, 108u);
  EXPECT_EQ(t[2].buffer_offset, 8u);
  EXPECT_EQ(t[2].size, 2u);
}

TEST(TaskSplitter, ZeroLengthRequestHasNoTasks) { EXPECT_EQ(TaskSplitter(5, 0, 4).count(), 0u); }

TEST(TaskSplitter, TaskSizeLargerThanRequestGivesOneTask) {
  TaskSplitter t(7, 3, 1 << 20);
  ASSERT_EQ(t.count(), 1u);
  EXPECT_EQ(t[0].size, 3u);
}

TEST(TaskSplitter, TasksCoverTheRequestExactlyOnce) {
  for (std::size_t size : {1u, 4095u, 4096u, 4097u, 12345u}) {
    for (std::size_t task : {1u, 7u, 4096u}) {
      TaskSplitter t(3, size, task);
      std::size_t covered = 0;
      for (std::size_t i = 0; i < t.count(); ++i) {
        EXPECT_EQ(t[i].buffer_offset, covered);
        EXPECT_EQ(t[i].file_offset, 3 + covered);
        EXPECT_GT(t[i].size, 0u);
        covered += t[i].size;
      }
      EXPECT_EQ(covered, size);
    }
  }
}

}  // namespace
}  // namespace ferry::core
