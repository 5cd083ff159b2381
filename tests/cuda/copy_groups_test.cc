// How a stream-ordered GPU request's pieces become the copies queued on the caller's stream
// (StagedCopies::copy_groups): few enough that a request queues a bounded number of operations,
// whatever its task size, and each a contiguous range of whole pieces in order.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/stream_order.h"

namespace ferry::cuda {
namespace {

using Piece = StagedCopies::Piece;
constexpr std::size_t kMiB = std::size_t{1} << 20;

std::vector<Piece> cut(std::size_t bytes, std::size_t task) {
  std::vector<Piece> pieces;
  for (std::size_t at = 0; at < bytes; at += task)
    pieces.push_back({at, std::min(task, bytes - at)});
  return pieces;
}

// Every piece in exactly one group, in order, and each group the exact span of its pieces.
void expect_cover(const std::vector<Piece>& pieces,
                  const std::vector<StagedCopies::CopyGroup>& groups) {
  std::size_t k = 0;
  for (const auto& g : groups) {
    ASSERT_GT(g.end, k);
    EXPECT_EQ(g.offset, pieces[k].offset);
    std::size_t size = 0;
    for (; k < g.end; ++k) size += pieces[k].size;
    EXPECT_EQ(g.size, size);
  }
  EXPECT_EQ(k, pieces.size());
}

TEST(CopyGroups, ManySmallTasksMakeAtMostTheBoundOfCopies) {
  for (std::size_t bytes : {8 * kMiB, 64 * kMiB, 1024 * kMiB, 64 * kMiB + 12345}) {
    for (std::size_t task : {std::size_t{4096}, 128 * std::size_t{1024}, kMiB, 4 * kMiB}) {
      const auto pieces = cut(bytes, task);
      const auto groups = StagedCopies::copy_groups(pieces, bytes);
      SCOPED_TRACE(::testing::Message() << bytes << " bytes in tasks of " << task);
      EXPECT_LE(groups.size(), StagedCopies::kMaxCopyGroups);
      expect_cover(pieces, groups);
    }
  }
}

TEST(CopyGroups, ASmallRequestIsOneCopyAndALargeOneSeveral) {
  auto pieces = cut(8 * kMiB, 128 * 1024);
  EXPECT_EQ(StagedCopies::copy_groups(pieces, 8 * kMiB).size(), 2u);  // 4 MiB at least each
  pieces = cut(3 * kMiB, kMiB);
  EXPECT_EQ(StagedCopies::copy_groups(pieces, 3 * kMiB).size(), 1u);
  pieces = cut(64 * kMiB, 4 * kMiB);
  EXPECT_EQ(StagedCopies::copy_groups(pieces, 64 * kMiB).size(), 16u);
}

TEST(CopyGroups, PiecesThatAreNotContiguousAreNeverCopiedAsOne) {
  // A gap between pieces 1 and 2, and a piece out of place (4 after 3's end is fine, 5 jumps back).
  const std::vector<Piece> pieces = {
      {0, 4096}, {4096, 4096}, {16384, 4096}, {20480, 4096}, {8192, 4096}};
  const auto groups = StagedCopies::copy_groups(pieces, 24576);
  ASSERT_EQ(groups.size(), 3u);
  expect_cover(pieces, groups);
  EXPECT_EQ(groups[0].size, 8192u);
  EXPECT_EQ(groups[1].offset, 16384u);
  EXPECT_EQ(groups[2].offset, 8192u);
}

TEST(CopyGroups, NoPiecesNoCopies) { EXPECT_TRUE(StagedCopies::copy_groups({}, 0).empty()); }

}  // namespace
}  // namespace ferry::cuda
