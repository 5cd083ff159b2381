// A remote checkpoint's tensors in few GETs (issue 48): neighbouring tensors coalesced into
// spans of about task_size (checkpoint/gathered_read.h), counted by the test HTTP server and in
// the load report; a span that fails is retried, or the load fails naming the URL and the
// span's bytes, never handing back tensors with holes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/gathered_read.h"
#include "ferry/checkpoint.h"
#include "ferry/checkpoint_writer.h"
#include "ferry/error.h"
#include "ferry/remote.h"
#include "served_folder.h"
#include "test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using checkpoint::plan_spans;
using checkpoint::SpanPlan;

constexpr std::size_t kTask = std::size_t{4} << 20;  // the default task_size

char at(std::size_t i) { return static_cast<char>(i * 7 + 3); }

TEST(PlanSpans, PacksSmallNeighboursUpToTheTaskSizeAndReadsBigOnesDirect) {
  std::vector<char> dst(64);
  // Four 10 B ranges back to back (one out of order), a 100 B one past a 20 B gap, one of the
  // task size, one past a gap wider than allowed.
  std::vector<ReadRange> ranges = {{10, 10, &dst[1]},  {0, 10, &dst[0]},   {20, 10, &dst[2]},
                                   {30, 10, &dst[3]},  {60, 100, &dst[4]}, {160, 200, &dst[5]},
                                   {1000, 5, &dst[6]}, {1005, 0, &dst[7]}};
  const SpanPlan p = plan_spans(ranges, 200, 50);
  ASSERT_EQ(p.spans.size(), 1u);
  EXPECT_EQ(p.spans[0].file_offset, 0u);
  EXPECT_EQ(p.spans[0].size, 160u);  // 0..40, the gap 40..60 read and dropped, 60..160
  EXPECT_EQ(p.staged_bytes, 160u);
  ASSERT_EQ(p.pieces.size(), 5u);
  EXPECT_EQ(p.pieces[0].to, &dst[0]);
  EXPECT_EQ(p.pieces[1].from, 10u);
  EXPECT_EQ(p.pieces[1].to, &dst[1]);
  EXPECT_EQ(p.pieces[4].from, 60u);
  EXPECT_EQ(p.pieces[4].size, 100u);
  ASSERT_EQ(p.direct.size(), 2u);  // the task-sized one, and the lone 5 B one; 0 B dropped
  EXPECT_EQ(p.direct[0].file_offset, 160u);
  EXPECT_EQ(p.direct[1].file_offset, 1000u);
}

TEST(PlanSpans, OverlappingRangesShareTheirSpan) {
  std::vector<char> a(8), b(8);
  std::vector<ReadRange> ranges = {{0, 8, a.data()}, {4, 8, b.data()}};
  const SpanPlan p = plan_spans(ranges, 100);
  ASSERT_EQ(p.spans.size(), 1u);
  EXPECT_EQ(p.spans[0].size, 12u);
  ASSERT_EQ(p.pieces.size(), 2u);
  EXPECT_EQ(p.pieces[1].from, 4u);
}

class RemoteCheckpoint : public test::ServedFolder {
 protected:
  // `small` tensors of 16 KiB, then one of 8 MiB (two tasks): model.safetensors.
  std::uint64_t save(std::size_t small) {
    data_.clear();
    std::vector<TensorSource> tensors;
    for (std::size_t i = 0; i <= small; ++i) {
      const std::size_t n = i < small ? 16 << 10 : 8 << 20;
      data_.emplace_back(n, at(i));
      std::mt19937 r(static_cast<unsigned>(i));
      for (std::size_t k = 0; k < n; k += 997) data_.back()[k] = static_cast<char>(r());
    }
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < data_.size(); ++i) {
      tensors.push_back({"t" + std::to_string(i),
                         Dtype::kU8,
                         {data_[i].size()},
                         data_[i].data(),
                         data_[i].size()});
      bytes += data_[i].size();
    }
    save_checkpoint(tensors, root_ / "m");
    return bytes;
  }
  std::size_t requests(const char* method) const {
    std::size_t n = 0;
    for (const std::string& line : server_->request_lines()) n += line.rfind(method, 0) == 0;
    return n;
  }
  void expect_same(const LoadResult& got) const {
    ASSERT_EQ(got.tensors.size(), data_.size());
    for (const LoadedTensor& t : got.tensors) {
      const std::size_t i = std::stoul(t.name.substr(1));
      ASSERT_EQ(t.nbytes, data_[i].size()) << t.name;
      EXPECT_EQ(std::memcmp(t.data, data_[i].data(), t.nbytes), 0) << t.name;
    }
  }

  static LoadOptions host() {
    LoadOptions o;
    o.memory = MemoryKind::kHostPageable;
    return o;
  }

  std::vector<std::vector<char>> data_;
  test::ScopedEnv fast_retries_{"FERRY_REMOTE_RETRIES", "2"};
};

TEST_F(RemoteCheckpoint, ManySmallTensorsTakeAboutOneGetPerTaskSize) {
  const std::uint64_t bytes = save(600);  // 9.4 MiB of small tensors, 8 MiB in one
  Checkpoint ckpt(server_->url("m/model.safetensors"));
  const std::size_t opening = server_->request_lines().size();
  EXPECT_EQ(opening, 2u);  // the HEAD, and one GET for the length field and the header
  EXPECT_EQ(server_->connections(), 1u);  // the GET took the HEAD's connection
  const LoadResult got = ckpt.load(host());
  expect_same(got);
  const std::size_t all = server_->request_lines().size();
  EXPECT_LE(all, (bytes + kTask - 1) / kTask + 3) << all << " requests";
  EXPECT_EQ(got.report.gets, requests("GET") - (opening - requests("HEAD")));
  EXPECT_EQ(got.report.retries, 0u);
  EXPECT_GE(got.report.connections, 1u);
  EXPECT_NE(got.report.summary().find(std::to_string(got.report.gets) + " GET(s)"),
            std::string::npos)
      << got.report.summary();
  EXPECT_NE(got.report.to_json().find("\"gets\":"), std::string::npos);
}

TEST_F(RemoteCheckpoint, ReadIntoCoalescesTooAndLandsEveryByte) {
  save(300);
  Checkpoint ckpt(server_->url("m/model.safetensors"));
  const std::size_t before = requests("GET");
  std::vector<std::vector<char>> out;
  std::vector<TensorTarget> targets;
  for (std::size_t i = 0; i < ckpt.tensors().size(); ++i) {
    out.emplace_back(ckpt.tensors()[i].nbytes);
    targets.push_back({i, out.back().data()});
  }
  const LoadReport r = ckpt.read_into(targets);
  EXPECT_EQ(requests("GET") - before, r.gets);
  EXPECT_LE(r.gets, 2u + 2u);  // 4.7 MiB of small tensors in 2 spans, 8 MiB in 2 tasks
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::size_t k = std::stoul(ckpt.tensors()[i].name.substr(1));
    EXPECT_EQ(out[i], data_[k]) << ckpt.tensors()[i].name;
  }
}

TEST_F(RemoteCheckpoint, AFailedSpanIsRetriedAndCounted) {
  save(300);
  Checkpoint ckpt(server_->url("m/"));
  server_->fail_next(1, 503);
  const LoadResult got = ckpt.load(host());
  expect_same(got);
  EXPECT_EQ(got.report.retries, 1u);
}

TEST_F(RemoteCheckpoint, ASpanThatFailsForGoodNamesTheUrlAndItsBytes) {
  save(300);
  Checkpoint ckpt(server_->url("m/"));
  server_->fail_next(100, 500);
  try {
    const LoadResult got = ckpt.load(host());
    FAIL() << "loaded " << got.tensors.size() << " tensors";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(server_->url("m/model.safetensors")), std::string::npos) << m;
    EXPECT_NE(m.find("HTTP 500"), std::string::npos) << m;
    EXPECT_NE(m.find("offset="), std::string::npos) << m;
    EXPECT_NE(m.find("after 3 attempts"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace ferry
