#include "ferry/plan.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "diagnostics/cufile_plan.h"
#include "platform/cufile_config.h"
#include "platform/fake_tree.h"
#include "platform/text_file.h"
#include "test_data.h"

namespace ferry {
namespace {

constexpr std::uint64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

CufilePieces pieces(std::uint64_t size) { return predict_cufile_pieces(size, false, {}); }

TEST(CufilePlan, FourAndEightMiBAreOnePiece) {
  for (auto size : {4 * kMiB, 8 * kMiB}) {
    auto p = pieces(size);
    ASSERT_TRUE(p.known);
    EXPECT_EQ(p.count, 1u);
    EXPECT_EQ(p.first_size, size);
    EXPECT_TRUE(p.count_measured);
  }
}

TEST(CufilePlan, SixteenMiBIsTwoPiecesOfEight) {
  auto p = pieces(16 * kMiB);
  EXPECT_EQ(p.count, 2u);
  EXPECT_EQ(p.first_size, 8 * kMiB);
  EXPECT_EQ(p.last_size, 8 * kMiB);
  EXPECT_EQ(p.words, "2 pieces of 8 MiB");
}

TEST(CufilePlan, ThirtyTwoMiBIsFourPieces) {
  auto p = pieces(32 * kMiB);
  EXPECT_EQ(p.count, 4u);
  EXPECT_EQ(p.first_size, 8 * kMiB);
}

TEST(CufilePlan, LargeRequestsAreCappedAtMaxRequestParallelism) {
  for (auto size : {64 * kMiB, 256 * kMiB, kGiB}) {
    auto p = pieces(size);
    EXPECT_EQ(p.count, 4u) << size;
    EXPECT_EQ(p.first_size, size / 4);
    EXPECT_TRUE(p.count_measured);
  }
}

TEST(CufilePlan, RegisteredBuffersFollowTheSameRule) {
  EXPECT_EQ(predict_cufile_pieces(16 * kMiB, true, {}).count, 2u);
  EXPECT_EQ(predict_cufile_pieces(kGiB, true, {}).count, 4u);
}

TEST(CufilePlan, NonMultipleSizeIsMarkedAsExtrapolated) {
  auto p = pieces(20 * kMiB);
  ASSERT_TRUE(p.known);
  EXPECT_EQ(p.count, 2u);
  EXPECT_EQ(p.first_size, 10 * kMiB);
  EXPECT_FALSE(p.count_measured);
  EXPECT_NE(p.words.find("not measured"), std::string::npos) << p.words;
}

TEST(CufilePlan, UnevenPiecesSayBoundariesArePredicted) {
  auto p = pieces(20 * kMiB + 4 * kKiB + 1);
  EXPECT_EQ(p.count, 2u);
  EXPECT_EQ(p.first_size % 4096, 0u);
  EXPECT_EQ(p.first_size + p.last_size, 20 * kMiB + 4 * kKiB + 1);
  EXPECT_NE(p.words.find("prediction"), std::string::npos) << p.words;
}

TEST(CufilePlan, ParallelIoFalseIsUnknownNotGuessed) {
  CufileScheduling s;
  s.parallel_io = false;
  auto p = predict_cufile_pieces(kGiB, false, s);
  EXPECT_FALSE(p.known);
  EXPECT_EQ(p.words, "cuFile's splitting rule with parallel_io=false is not known");
}

TEST(CufilePlan, UnknownConfigValueIsUnknownWithReason) {
  CufileScheduling s;
  s.max_request_parallelism.reset();
  s.unknown_reason = "execution.max_request_parallelism: expected a non-negative integer";
  auto p = predict_cufile_pieces(kGiB, false, s);
  EXPECT_FALSE(p.known);
  EXPECT_NE(p.words.find("max_request_parallelism"), std::string::npos);
}

// A read into GPU 0 of the libcuda double, so that the plan does not depend on this machine;
// compat_mode=off by default, so that cuFile's process-wide outlook (no nvidia-fs here) cannot
// send it to ferry's POSIX path.
PlanRequest gpu_read(std::uint64_t size, CompatMode compat = CompatMode::kOff) {
  setenv("FERRY_CUDA_LIBRARY", FERRY_FAKE_CUDA_PATH, 1);
  PlanRequest r;
  r.size = size;
  r.gpu = 0;
  r.settings.compat_mode = compat;
  return r;
}

ReasonCode first_reason(const Plan& p) {
  return p.reasons.empty() ? ReasonCode::kEngine : p.reasons.front().code;
}

TEST(Plan, OneGiBInFourMiBTasksIs256RequestsOfOnePiece) {
  auto p = plan(gpu_read(kGiB));
  EXPECT_EQ(p.path, Path::kCufile);
  EXPECT_EQ(p.task_count, 256u);
  EXPECT_EQ(p.first_task_size, 4 * kMiB);
  EXPECT_EQ(p.last_task_size, 4 * kMiB);
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0].pieces->count, 1u);
  EXPECT_EQ(p.cufile_pieces_total, 256u);
}

TEST(Plan, TaskSizeOneGiBIsOneRequestOfFourPiecesOf256MiB) {
  PlanRequest r = gpu_read(kGiB);
  r.settings.task_size = kGiB;
  auto p = plan(r);
  EXPECT_EQ(p.task_count, 1u);
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0].pieces->count, 4u);
  EXPECT_EQ(p.groups[0].pieces->first_size, 256 * kMiB);
  EXPECT_NE(format_plan(p).find("4 pieces of 256 MiB"), std::string::npos) << format_plan(p);
}

TEST(Plan, SixteenMiBInOneTaskIsTwoPiecesOfEightMiB) {
  PlanRequest r = gpu_read(16 * kMiB);
  r.settings.task_size = 16 * kMiB;
  auto p = plan(r);
  EXPECT_EQ(p.task_count, 1u);
  EXPECT_EQ(p.groups[0].pieces->count, 2u);
  EXPECT_EQ(p.groups[0].pieces->first_size, 8 * kMiB);
}

TEST(Plan, ThirtyTwoMiBInOneTaskIsFourPieces) {
  PlanRequest r = gpu_read(32 * kMiB);
  r.settings.task_size = 32 * kMiB;
  EXPECT_EQ(plan(r).cufile_pieces_total, 4u);
}

TEST(Plan, EightKiBIsPosixBelowTheSixteenKiBThreshold) {
  auto p = plan(gpu_read(8 * kKiB, CompatMode::kAuto));
  EXPECT_EQ(p.path, Path::kPosix);
  EXPECT_EQ(first_reason(p), ReasonCode::kBelowThreshold);
  EXPECT_EQ(p.task_count, 1u);
  EXPECT_FALSE(p.cufile_pieces_total);
  ASSERT_FALSE(p.words.empty());
  EXPECT_NE(p.words[0].find("below gds_threshold 16 KiB"), std::string::npos) << p.words[0];
  EXPECT_NE(p.words[0].find("cuFile is not called"), std::string::npos);
}

// The engine applies gds_threshold in auto mode only (src/core/routing.cc); plan must agree,
// and must split a small request into tasks the way the engine does.
TEST(Plan, CompatOffSendsEvenSmallRequestsToCufile) {
  auto p = plan(gpu_read(8 * kKiB, CompatMode::kOff));
  EXPECT_EQ(p.path, Path::kCufile);
  EXPECT_EQ(p.cufile_pieces_total, 1u);
}

TEST(Plan, SmallRequestBelowThresholdIsSplitLikeTheEngineSplitsIt) {
  PlanRequest r = gpu_read(10 * kKiB, CompatMode::kAuto);
  r.settings.task_size = 4 * kKiB;
  auto p = plan(r);
  EXPECT_EQ(first_reason(p), ReasonCode::kBelowThreshold);
  EXPECT_EQ(p.task_count, 3u);
  EXPECT_EQ(p.last_task_size, 2 * kKiB);
}

TEST(Plan, ThresholdItselfIsNotBelowIt) {
  auto p = plan(gpu_read(16 * kKiB, CompatMode::kAuto));
  EXPECT_NE(first_reason(p), ReasonCode::kBelowThreshold) << format_plan(p);
}

TEST(Plan, LastTaskIsShorterAndGetsItsOwnPieces) {
  PlanRequest r = gpu_read(10 * kMiB);
  r.offset = 4096;
  r.settings.task_size = 4 * kMiB;
  auto p = plan(r);
  EXPECT_EQ(p.task_count, 3u);
  ASSERT_EQ(p.groups.size(), 2u);
  EXPECT_EQ(p.groups[0].count, 2u);
  EXPECT_EQ(p.groups[1].task_size, 2 * kMiB);
  EXPECT_EQ(p.last_task_size, 2 * kMiB);
  EXPECT_EQ(p.cufile_pieces_total, 3u);
}

TEST(Plan, CompatModeOnNeverCallsCufile) {
  auto p = plan(gpu_read(kGiB, CompatMode::kOn));
  EXPECT_EQ(p.path, Path::kPosix);
  EXPECT_EQ(first_reason(p), ReasonCode::kCompatModeOn);
  EXPECT_EQ(p.task_count, 256u);
  EXPECT_FALSE(p.groups[0].pieces);
  EXPECT_FALSE(p.cufile_pieces_total);
}

TEST(Plan, EmptyRequestReadsNothing) {
  PlanRequest r;
  EXPECT_EQ(plan(r).task_count, 0u);
  EXPECT_EQ(plan(r).words.at(0), "Nothing to read: the request is 0 bytes.");
}

TEST(Plan, SchedulingComesFromTheStockCufileJson) {
  platform::testing::FakeTree t;
  t.write("etc/cufile.json",
          platform::read_text_file(test::test_data("platform") / "cufile/stock.json").text);
  auto s = diagnostics::scheduling_from_config(platform::read_cufile_config(t.root(), {}));
  EXPECT_EQ(s.parallel_io, true);
  EXPECT_EQ(s.min_io_threshold_size_kb, 8192u);
  EXPECT_EQ(s.max_request_parallelism, 4u);
  EXPECT_NE(s.source.find("/etc/cufile.json"), std::string::npos);
}

TEST(Plan, BrokenCufileJsonMakesPiecesUnknown) {
  platform::testing::FakeTree t;
  t.write("etc/cufile.json", "{ oops");
  PlanRequest r = gpu_read(kGiB);
  r.cufile = diagnostics::scheduling_from_config(platform::read_cufile_config(t.root(), {}));
  auto p = plan(r);
  EXPECT_FALSE(p.groups[0].pieces->known);
  EXPECT_FALSE(p.cufile_pieces_total);
  EXPECT_NE(p.groups[0].pieces->words.find("does not parse"), std::string::npos)
      << p.groups[0].pieces->words;
}

}  // namespace
}  // namespace ferry
