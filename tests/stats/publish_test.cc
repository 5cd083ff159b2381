// The published segment from inside one process (docs/stats.md): made at the first request with
// mode 0600, read back exactly by the reader, never torn under concurrent writers, counts of
// exited threads and of threads beyond the slots kept, withdrawal and republication with counts
// carried over while threads count, a fork() child counting its own, bytes in flight.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "scripted_io.h"
#include "stats/stats_layout.h"
#include "stats/stats_publish.h"
#include "stats/stats_recorder.h"
#include "stats/stats_segment.h"
#include "test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
namespace L = statistics::stats_layout;

// One stats directory for the whole binary, set before its first request. Held by a global (a
// fork() child that exits leaks nothing) and removed only in TearDown (not by the child).
test::TempDir* stats_dir = nullptr;

class StatsDir : public ::testing::Environment {
 public:
  void SetUp() override {
    stats_dir = new test::TempDir;
    setenv("FERRY_STATS_DIR", stats_dir->path().c_str(), 1);
  }
  void TearDown() override {
    delete stats_dir;
    stats_dir = nullptr;
  }
  static fs::path path() { return std::getenv("FERRY_STATS_DIR"); }
};
const auto* const kStatsDir = ::testing::AddGlobalTestEnvironment(new StatsDir);

void small_read(std::uint64_t bytes = 4096) {
  statistics::record_small_request(Op::kRead, bytes, 1500, ReasonCode::kHostBuffer, false);
}

ProcessStats mine() { return read_process_stats(static_cast<int>(getpid())); }

fs::path my_segment() {
  return StatsDir::path() / ("ferry." + std::to_string(geteuid()) + "." + std::to_string(getpid()));
}

TEST(Publish, TheSegmentIsMadeAtTheFirstRequestReadableByItsOwnerOnly) {
  test::TempDir dir;
  test::write_file(dir / "a.bin", test::random_bytes(64 << 10, 1));
  File f(dir / "a.bin");
  std::vector<unsigned char> buf(4096);
  ASSERT_EQ(f.read(buf.data(), buf.size(), 0), buf.size());
  PublishStatus s = publish_status();
  EXPECT_TRUE(s.wanted);
  ASSERT_TRUE(s.published) << s.why_not;
  EXPECT_EQ(fs::path(s.path), my_segment());
  struct stat st {};
  ASSERT_EQ(stat(s.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), L::kSegmentBytes);
  ProcessStats p = mine();
  EXPECT_EQ(p.pid, getpid());
  EXPECT_EQ(p.uid, geteuid());
  EXPECT_EQ(p.layout_version, L::kVersion);
  EXPECT_FALSE(p.exited);
  EXPECT_GE(p.totals.requests, 1u);
  EXPECT_GT(p.process_started, 1e9);
  EXPECT_GE(p.counting_since + 1, p.process_started);
}

TEST(Publish, TheReaderSeesExactlyWhatStatsSays) {
  ASSERT_TRUE(publish_stats(true).published);  // made now, if no request made it yet
  reset_stats();
  const ProcessStats before = mine();
  for (int i = 0; i < 1000; ++i) small_read();
  statistics::record_small_request(Op::kWrite, 8192, 3000, ReasonCode::kBelowThreshold, true, 3);
  const ProcessStats after = mine();
  const Stats s = stats();
  EXPECT_EQ(s.requests, 1001u);
  EXPECT_EQ(after.totals.requests - before.totals.requests, 1001u);
  EXPECT_EQ(after.totals.bytes_read - before.totals.bytes_read, 1000u * 4096);
  EXPECT_EQ(after.totals.bytes_written - before.totals.bytes_written, 8192u);
  EXPECT_EQ(
      after.posix.reasons.at("host_buffer") -
          (before.posix.reasons.count("host_buffer") ? before.posix.reasons.at("host_buffer") : 0),
      1000u);
  EXPECT_EQ(after.posix.reasons.at("below_threshold"), 1u);
  EXPECT_EQ(after.posix.reasons.at("cold_direct"), 1u);
  EXPECT_EQ(after.posix.write_latency.total(), 1u);
  // The write into GPU 3's memory has its own memory entry.
  bool gpu3 = false;
  for (const MemoryCounters& m : after.memories) {
    if (m.name == "gpu 3") {
      gpu3 = true;
      EXPECT_EQ(m.device, 3);
      EXPECT_EQ(m.posix.writes, 1u);
      EXPECT_EQ(m.posix.bytes_written, 8192u);
    }
  }
  EXPECT_TRUE(gpu3) << after.to_text();
  // Latency 1500 ns: at most 2.048 us.
  EXPECT_DOUBLE_EQ(after.posix.read_latency.quantile(0.5), 2048e-9);
}

TEST(Publish, ARouteReportCountsAtBothLayersPerMemory) {
  ASSERT_TRUE(publish_stats(true).published);
  const ProcessStats before = mine();
  RouteReport r;
  r.op = Op::kRead;
  r.memory = MemoryKind::kDevice;
  r.device = 1;
  r.bytes = 1 << 20;
  r.tasks = 4;
  r.cufile_tasks = 4;
  r.seconds = 0.002;
  r.cufile.nvfs = 3;
  r.cufile.posix = 1;
  r.cufile.p2p = 0;
  r.reasons = {{ReasonCode::kEngine, "cuFile"}};
  statistics::record_request(r, false);
  r.memory = MemoryKind::kHostPageable;
  r.device = -1;
  r.cufile_tasks = 0;
  r.posix_tasks = 2;
  r.cufile = {};
  r.reasons = {{ReasonCode::kHostBuffer, "host"}, {ReasonCode::kEngine, "pread"}};
  statistics::record_request(r, true);
  const ProcessStats after = mine();
  EXPECT_EQ(after.cufile.counts.requests() - before.cufile.counts.requests(), 1u);
  EXPECT_EQ(after.totals.nvfs_pieces - before.totals.nvfs_pieces, 3u);
  EXPECT_EQ(after.totals.compat_pieces - before.totals.compat_pieces, 1u);
  EXPECT_EQ(after.totals.failed_requests - before.totals.failed_requests, 1u);
  bool gpu1 = false;
  for (const MemoryCounters& m : after.memories) {
    if (m.device == 1) {
      gpu1 = true;
      EXPECT_EQ(m.cufile.reads, 1u);
      EXPECT_EQ(m.cufile.tasks, 4u);
      EXPECT_EQ(m.nvfs_pieces, 3u);
      EXPECT_EQ(m.compat_pieces, 1u);
    }
  }
  EXPECT_TRUE(gpu1);
  EXPECT_GE(after.cufile.reasons.at("engine"), 1u);
  EXPECT_NE(after.to_text().find("layer 2 (cuFile): nvfs="), std::string::npos);
  const std::string om = to_openmetrics({after});
  EXPECT_NE(om.find("ferry_cufile_pieces_total{pid=\"" + std::to_string(getpid())),
            std::string::npos);
  EXPECT_NE(om.find("memory=\"gpu 1\",layer2=\"nvfs\"} 3"), std::string::npos) << om;
}

TEST(Publish, CountsOfExitedThreadsAndOfThreadsBeyondTheSlotsAreKept) {
  ASSERT_TRUE(publish_stats(true).published);
  const std::uint64_t before = mine().totals.requests;
  // One after another: each thread's slot is folded in and reused.
  for (int i = 0; i < 300; ++i)
    std::thread([] {
      for (int k = 0; k < 10; ++k) small_read();
    }).join();
  EXPECT_EQ(mine().totals.requests - before, 3000u);
  // More threads at once than there are slots: the rest share one, under a lock.
  std::atomic<int> ready{0};
  std::vector<std::thread> many;
  const int n = static_cast<int>(L::kSlots) + 40;
  for (int i = 0; i < n; ++i) {
    many.emplace_back([&] {
      small_read();
      ready.fetch_add(1);
      while (ready.load() < n) std::this_thread::yield();  // all alive at once
      for (int k = 0; k < 99; ++k) small_read();
    });
  }
  for (auto& t : many) t.join();
  EXPECT_EQ(mine().totals.requests - before, 3000u + 100u * n);
}

TEST(Publish, AConcurrentReaderNeverSeesATornOrShrinkingCount) {
  test::TempDir dir;
  test::write_file(dir / "a.bin", test::random_bytes(1 << 20, 2));
  File f(dir / "a.bin");
  std::vector<unsigned char> warm(4096);
  f.read(warm.data(), warm.size(), 0);
  const ProcessStats base = mine();
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int i = 0; i < 4; ++i) {
    writers.emplace_back([&, i] {
      // Real 4 KiB reads through ferry, back to back.
      std::vector<unsigned char> buf(4096);
      for (std::uint64_t k = 0; !stop.load(std::memory_order_relaxed); ++k) {
        f.read(buf.data(), buf.size(), ((k * 4 + i) % 256) * 4096);
      }
    });
  }
  // The writers stop and are joined however the reader's loop ends: a reader that threw used to
  // leave them joinable, and std::terminate hid what it threw.
  struct StopAndJoin {
    std::atomic<bool>& stop;
    std::vector<std::thread>& threads;
    ~StopAndJoin() {
      stop = true;
      for (auto& t : threads) t.join();
    }
  };
  std::uint64_t last = 0;
  {
    StopAndJoin guard{stop, writers};
    for (int i = 0; i < 300; ++i) {
      ProcessStats p;
      try {
        p = mine();
      } catch (const StatsError& e) {
        ADD_FAILURE() << "reading a busy, live process's counters, look " << i << ": " << e.what();
        break;
      }
      const std::uint64_t requests = p.totals.requests - base.totals.requests;
      EXPECT_EQ(p.totals.bytes_read - base.totals.bytes_read, requests * 4096);
      EXPECT_EQ(p.posix.read_latency.total() - base.posix.read_latency.total(), requests);
      EXPECT_GE(requests, last);
      last = requests;
    }
  }
  EXPECT_GT(last, 0u);
}

TEST(Publish, WithdrawingAndPublishingAgainCarriesEveryCountWhileThreadsCount) {
  ASSERT_TRUE(publish_stats(true).published);
  const std::uint64_t base = stats().requests;
  const std::uint64_t base_published = mine().totals.requests;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> made{0};
  std::vector<std::thread> writers;
  for (int i = 0; i < 3; ++i) {
    writers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        small_read();
        made.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  for (int i = 0; i < 20; ++i) {
    PublishStatus off = publish_stats(false);
    EXPECT_FALSE(off.published);
    EXPECT_FALSE(fs::exists(my_segment()));
    EXPECT_THROW(mine(), StatsError);
    PublishStatus on = publish_stats(true);
    ASSERT_TRUE(on.published) << on.why_not;
    EXPECT_TRUE(fs::exists(my_segment()));
  }
  stop = true;
  for (auto& t : writers) t.join();
  EXPECT_EQ(stats().requests - base, made.load()) << "no count lost in a takeover";
  const ProcessStats p = mine();
  EXPECT_EQ(p.totals.requests - base_published, made.load());
  // The published total is the count since the start: every request, none twice.
  reset_stats();
  small_read();
  EXPECT_EQ(mine().totals.requests, p.totals.requests + 1);
}

TEST(Publish, AForkChildCountsItsOwnRequestsInASegmentOfItsOwn) {
  small_read();
  const std::uint64_t parent_before = mine().totals.requests;
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    int code = 0;
    if (stats().requests != 0) code = 2;
    for (int i = 0; i < 5; ++i) small_read();
    try {
      ProcessStats c = read_process_stats(static_cast<int>(getpid()));
      if (c.totals.requests != 5) code = 3;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      code = 4;
    }
    _exit(code);  // as Python's multiprocessing children end: no exit handlers
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(mine().totals.requests, parent_before) << "the child counted in its own segment";
  // _exit ran no exit handler: the child's segment stays until a reader finds its process gone.
  const fs::path child =
      StatsDir::path() / ("ferry." + std::to_string(geteuid()) + "." + std::to_string(pid));
  EXPECT_TRUE(fs::exists(child));
  bool listed = false;
  for (const ProcessEntry& e : list_process_stats()) {
    if (e.pid != pid) continue;
    listed = true;
    EXPECT_EQ(e.state, ProcessEntry::State::kRemoved) << e.detail;
    ASSERT_TRUE(e.stats.has_value());
    EXPECT_EQ(e.stats->totals.requests, 5u) << "its last counters";
  }
  EXPECT_TRUE(listed);
  EXPECT_FALSE(fs::exists(child));
}

TEST(Publish, BytesInFlightAreCountedOnceTheEngineReportsStarts) {
  statistics::note_request_started(1 << 20);
  statistics::note_request_started(4096);
  ProcessStats p = mine();
  EXPECT_TRUE(p.inflight_known);
  EXPECT_EQ(p.inflight_requests, 2u);
  EXPECT_EQ(p.inflight_bytes, (1u << 20) + 4096);
  std::thread([] { statistics::note_request_ended(1 << 20); }).join();
  statistics::note_request_ended(4096);
  p = mine();
  EXPECT_EQ(p.inflight_requests, 0u);
  EXPECT_EQ(p.inflight_bytes, 0u);
}

// Waits until `io` has a call inside the system, at most 5 s.
bool wait_in_flight(const test::ScriptedIo& io) {
  for (int i = 0; i < 5000 && io.in_flight.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return io.in_flight.load() > 0;
}

// What is in flight now, against `before`: `requests` more requests of `bytes` more bytes.
void expect_in_flight(const ProcessStats& before, std::uint64_t requests, std::uint64_t bytes) {
  ProcessStats now = mine();
  EXPECT_TRUE(now.inflight_known);
  EXPECT_EQ(now.inflight_requests, before.inflight_requests + requests);
  EXPECT_EQ(now.inflight_bytes, before.inflight_bytes + bytes);
}

TEST(Publish, APooledRequestIsInFlightFromSubmitUntilItCompletes) {
  test::TempDir dir;
  auto path = dir / "pooled.bin";
  test::write_file(path, test::random_bytes(1 << 20, 7));
  test::ScriptedIo io;
  io.slow_offset = 0;
  io.slow = std::chrono::milliseconds(300);
  File f = test::open_scripted(io, path, "r", "64KiB", "2");
  std::vector<unsigned char> buf(2 << 20);
  small_read();  // the segment exists before the first look
  const ProcessStats before = mine();
  // 2 MiB asked for, 1 MiB in the file: the request's tasks hold 1 MiB.
  IoFuture fut = f.pread(buf.data(), buf.size(), 0);
  ASSERT_TRUE(wait_in_flight(io));
  expect_in_flight(before, 1, 1 << 20);
  EXPECT_EQ(fut.get(), 1u << 20);
  expect_in_flight(before, 0, 0);
}

TEST(Publish, ASmallRequestIsInFlightInItsCallersThreadAndCountsAsHostMemory) {
  test::TempDir dir;
  auto path = dir / "small.bin";
  test::write_file(path, test::random_bytes(64 << 10, 8));
  test::ScriptedIo io;
  io.slow_offset = 4096;
  io.slow = std::chrono::milliseconds(300);
  File f = test::open_scripted(io, path, "r");
  std::vector<unsigned char> buf(4096);
  small_read();
  const ProcessStats before = mine();
  auto host_reads = [](const ProcessStats& p) -> std::uint64_t {
    for (const MemoryCounters& m : p.memories) {
      if (m.device == MemoryCounters::kHost) return m.posix.reads;
    }
    return 0;
  };
  std::thread reader([&] { EXPECT_EQ(f.read(buf.data(), buf.size(), 4096), 4096u); });
  ASSERT_TRUE(wait_in_flight(io));
  expect_in_flight(before, 1, 4096);
  reader.join();
  EXPECT_EQ(f.last_route().tasks, 1u);
  expect_in_flight(before, 0, 0);
  EXPECT_EQ(host_reads(mine()), host_reads(before) + 1) << "a small read of host memory";
  // A small request that fails ends too.
  io.slow_offset = -1;
  io.fail_offset = 0;
  EXPECT_THROW(f.read(buf.data(), buf.size(), 0), IoError);
  expect_in_flight(before, 0, 0);
}

// Issue 45, B13: a segment that this user's process left when it was killed, under a pid that a
// process of another user holds now, stayed forever: the next publisher's cleanup saw the pid
// alive. The start time in its header, earlier than the present process's, says it is stale.
TEST(Publish, TheCleanupRemovesThisUsersSegmentOfAPidReusedByAnotherUser) {
  if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) {
    GTEST_SKIP() << "needs root and /usr/bin/setpriv (a process of the user nobody)";
  }
  test::TempDir dir;
  const pid_t other = fork();
  ASSERT_GE(other, 0);
  if (other == 0) {
    execl("/usr/bin/setpriv", "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
          "/bin/sleep", "60", static_cast<char*>(nullptr));
    _exit(127);
  }
  // Once it runs as nobody (setpriv has switched and exec'd sleep).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    std::ifstream status("/proc/" + std::to_string(other) + "/status");
    std::string text((std::istreambuf_iterator<char>(status)), std::istreambuf_iterator<char>());
    if (text.find("\nUid:\t65534\t65534") != std::string::npos) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << text;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::uint64_t ticks = statistics::read_start_ticks(other, nullptr);
  ASSERT_GT(ticks, 1u);
  auto segment = [&](std::uint64_t start_ticks) {
    std::string bytes(L::kSegmentBytes, '\0');
    auto set = [&](std::size_t word, std::uint64_t v) { std::memcpy(&bytes[word * 8], &v, 8); };
    set(L::kHMagic, L::kMagic);
    set(L::kHVersion, L::kVersion);
    set(L::kHPid, static_cast<std::uint64_t>(other));
    set(L::kHUid, geteuid());
    set(L::kHStartTicks, start_ticks);
    const fs::path path = dir / statistics::segment_name(geteuid(), other);
    std::ofstream(path, std::ios::binary) << bytes;
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
    return path;
  };
  // Made by the very process (it changed its uid after it began publishing): kept.
  fs::path path = segment(ticks);
  EXPECT_EQ(statistics::remove_dead_segments(dir.path().string(), geteuid()), 0u);
  EXPECT_TRUE(fs::exists(path));
  // Left by a process of this user that started earlier: stale, removed.
  path = segment(ticks - 1);
  EXPECT_EQ(statistics::remove_dead_segments(dir.path().string(), geteuid()), 1u);
  EXPECT_FALSE(fs::exists(path));
  kill(other, SIGKILL);
  waitpid(other, nullptr, 0);
}

TEST(Publish, TheReaderOfACopyAgreesAndRejectsDamage) {
  small_read();
  std::ifstream in(my_segment(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  statistics::BufferSource copy(bytes.data(), bytes.size());
  statistics::SegmentRead r = statistics::read_segment(copy);
  ASSERT_EQ(r.problem, statistics::SegmentProblem::kNone) << r.message;
  EXPECT_EQ(statistics::stats_from_sum(r.sum).requests, mine().totals.requests);
  // Every header word changed in turn: a clear problem or the same valid read, never a crash.
  for (std::size_t w = 0; w < L::kHeaderUsedWords; ++w) {
    std::string damaged = bytes;
    damaged[w * 8 + 3] ^= 0x5a;
    statistics::BufferSource src(damaged.data(), damaged.size());
    statistics::ReadPolicy quick;
    quick.attempts = 3;
    statistics::SegmentRead d = statistics::read_segment(src, quick);
    if (d.problem != statistics::SegmentProblem::kNone) {
      EXPECT_FALSE(d.message.empty()) << w;
    }
  }
  for (std::size_t cut : {0ul, 7ul, 4095ul, 4096ul, 5000ul, bytes.size() - 1}) {
    statistics::BufferSource src(bytes.data(), cut);
    EXPECT_EQ(statistics::read_segment(src).problem, statistics::SegmentProblem::kTooSmall) << cut;
  }
}

}  // namespace
}  // namespace ferry
