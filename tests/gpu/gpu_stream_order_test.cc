// Stream-ordered reads and writes (File::read_async, File::write_async): the GPU work queued on
// the stream before the call runs before the request touches the buffer, the work queued after
// runs after the bytes are in place, and the caller is never blocked. The stream's earlier work
// is held back by a gate (cuStreamWaitValue32 on a flag the test sets after a random delay), so
// a request that did not wait for it would be overwritten by it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "backends/default_runtime.h"
#include "core/runtime_state.h"
#include "cuda/cuda_driver.h"
#include "cuda/stream_order.h"
#include "ferry/ferry.h"
#include "test_hooks.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::kThreadSanitizer;
using test::TempDir;
namespace abi = cuda::abi;

// How long a test may run before its watchdog opens the gates (see SetUp).
constexpr int kWatchdogSeconds = kThreadSanitizer ? 300 : 60;
using Clock = std::chrono::steady_clock;

class GpuStream : public ::testing::TestWithParam<bool> {
 public:
  void SetUp() override {
    CudaStatus cuda = cuda_status();
    if (!cuda.available || cuda.gpus.empty()) {
      GTEST_SKIP() << "no GPU: " << (cuda.why_not.empty() ? "no device" : cuda.why_not);
    }
    const cuda::Driver& d = cuda::driver();
    cuda::use_device(0);
    // GetParam(): the legacy default stream (0), else a stream of the test's own (blocking,
    // as cudaStreamCreate makes them).
    if (!GetParam()) {
      ASSERT_EQ(d.StreamCreate(&stream_, abi::kStreamDefault), abi::kSuccess);
    }
    void* p = nullptr;
    ASSERT_EQ(d.MemHostAlloc(&p, 4096, abi::kMemHostAllocPortable | abi::kMemHostAllocDeviceMap),
              abi::kSuccess);
    gate_ = static_cast<std::uint32_t*>(p);
    *gate_ = 0;
    ASSERT_EQ(d.MemHostGetDevicePointer(&gate_device_, p, 0), abi::kSuccess);
    // Opens every gate if the test has not finished in time: a request that blocked its caller
    // until the stream passed would otherwise hang here. Under ThreadSanitizer everything runs
    // 5 to 15 times slower: on the 2-core CI machine, two of these tests at once under TSan took
    // 100 s without blocking (the watchdog saw them make progress), so it waits 300 s there,
    // still inside CTest's 600 s timeout.
    watchdog_ = std::thread([this] {
      const auto deadline = Clock::now() + std::chrono::seconds(kWatchdogSeconds);
      while (!finished_.load() && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (finished_.load()) return;
      fired_.store(true);
      report_state(kThreadSanitizer ? "after 300 s (TSan), before opening the gate"
                                    : "after 60 s, before opening the gate");
      open_gate(0x7fffffff);
      // Where things stand while it stays stuck, for the log of a hang.
      for (int i = 1; i <= 4 && !finished_.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        if (!finished_.load()) report_state("after the gate opened");
      }
    });
  }

  void TearDown() override {
    finished_.store(true);
    if (watchdog_.joinable()) watchdog_.join();
    if (const cuda::Driver* d = cuda::driver_or_null()) {
      if (gate_ != nullptr) {
        d->StreamSynchronize(stream_);
        d->MemFreeHost(gate_);
      }
      if (stream_ != nullptr) d->StreamDestroy(stream_);
    }
    EXPECT_FALSE(fired_.load()) << "the watchdog had to open the gates: a call blocked";
  }

  // Where the test is (set by the test body) and what ferry's stream-ordered machinery holds.
  void at(const char* phase, int round = -1) {
    phase_.store(phase);
    round_.store(round);
  }
  void report_state(const char* when) {
    core::ThreadPool& pool = backends::default_runtime().ordered_pool();
    std::fprintf(stderr,
                 "watchdog %s: the test is at '%s' (round %d); host functions queued %llu, run "
                 "%llu; gates in use %zu; ordered pool: %zu threads, %zu jobs waiting\n",
                 when, phase_.load(), round_.load(),
                 static_cast<unsigned long long>(cuda::host_functions_queued()),
                 static_cast<unsigned long long>(cuda::host_functions_run()),
                 cuda::stream_gates_in_use(), pool.size(), pool.waiting());
  }

  // Queues on the stream: wait until the gate reaches `value`.
  void hold_until(std::uint32_t value) {
    ASSERT_EQ(
        cuda::driver().StreamWaitValue32(stream_, gate_device_, value, abi::kStreamWaitValueGeq),
        abi::kSuccess);
  }
  void open_gate(std::uint32_t value) {
    std::atomic_ref<std::uint32_t>(*gate_).store(value, std::memory_order_seq_cst);
  }
  void* stream_handle() const { return stream_; }

  abi::Stream stream_ = nullptr;
  std::uint32_t* gate_ = nullptr;
  abi::DevicePtr gate_device_ = 0;
  std::thread watchdog_;
  std::atomic<bool> finished_{false};
  std::atomic<bool> fired_{false};
  std::atomic<const char*> phase_{"set up"};
  std::atomic<int> round_{-1};
};

abi::DevicePtr dptr(const Buffer& b) { return reinterpret_cast<abi::DevicePtr>(b.data()); }

// Each round: [gate] earlier work fills the buffer with 0xAA; read_async (or, with
// `ordered` false, pread: a request that does not wait for the stream); later work copies the
// buffer out. The gate opens 0-3 ms after the call returned. Rounds follow each other on the
// stream without synchronising it. Returns the rounds whose copy differs from the file. Each read
// is two tasks, of a quarter of the size under a sanitizer (test::kShrink).
int rounds_out_of_order(GpuStream& t, const std::filesystem::path& path,
                        const std::vector<unsigned char>& data, std::uint32_t first_gate,
                        RouteReport* last, bool ordered = true) {
  const std::size_t task = (std::size_t{4} << 20) / test::kShrink;  // the default, shrunk
  const std::size_t size = task + 4096 + 17;
  const cuda::Driver& d = cuda::driver();
  constexpr int kRounds = 24;
  FileOptions options;
  options.settings.set("task_size", std::to_string(task));
  options.settings.set("bounce_buffer_size", std::to_string(task));
  File f(path, "r", options);
  Buffer fill(MemoryKind::kHostPinned, size, 0);
  std::memset(fill.data(), 0xAA, size);
  std::vector<Buffer> out;
  std::vector<Buffer> gpu;
  std::vector<std::uint64_t> offsets;
  std::vector<IoFuture> futures;
  std::mt19937_64 rng(62);
  for (int i = 0; i < kRounds; ++i) {
    gpu.emplace_back(MemoryKind::kDevice, size, 0);
    out.emplace_back(MemoryKind::kHostPinned, size, 0);
    offsets.push_back(rng() % (data.size() - size));
    t.hold_until(first_gate + i);
    EXPECT_EQ(d.MemcpyHtoDAsync(dptr(gpu.back()), fill.data(), size, t.stream_), abi::kSuccess);
    futures.push_back(ordered
                          ? f.read_async(gpu.back().data(), size, offsets.back(), t.stream_handle())
                          : f.pread(gpu.back().data(), size, offsets.back()));
    EXPECT_EQ(d.MemcpyDtoHAsync(out.back().data(), dptr(gpu.back()), size, t.stream_),
              abi::kSuccess);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    t.open_gate(first_gate + i);
  }
  EXPECT_EQ(d.StreamSynchronize(t.stream_), abi::kSuccess);
  int wrong = 0;
  for (int i = 0; i < kRounds; ++i) {
    EXPECT_EQ(futures[i].get(), size);
    if (std::memcmp(out[i].data(), data.data() + offsets[i], size) != 0) ++wrong;
  }
  *last = futures.back().route();
  return wrong;
}

TEST_P(GpuStream, ReadLandsAfterTheStreamsEarlierWorkAndBeforeItsLaterWork) {
  TempDir dir;
  const auto data = test::pattern_bytes((96 << 20) / test::kShrink, 61);
  test::write_file(dir / "f.bin", data);
  RouteReport r;
  EXPECT_EQ(rounds_out_of_order(*this, dir / "f.bin", data, 1, &r), 0)
      << "the later work saw 0xAA: the read landed before the earlier work, or the later work "
         "ran before the read";
  EXPECT_EQ(r.memory, MemoryKind::kDevice);
  EXPECT_NE(r.to_text().find("stream-ordered"), std::string::npos) << r.to_text();
  EXPECT_EQ(cuda::stream_gates_in_use(), 0u);
}

// The check above can fail: with requests that start at once instead of by the stream (pread,
// whose copies run on ferry's own streams), the fills held back by the gate land on top of the
// reads.
TEST_P(GpuStream, WithoutTheWaitForEarlierWorkTheCheckSeesTheOrderBroken) {
  if (test::on_fake_cuda() && test::fake_cuda_queues() == 1) {
    GTEST_SKIP() << "one hardware queue runs every stream in the order work was queued, so a "
                    "request on a stream of its own is ordered by accident";
  }
  if (test::kThreadSanitizer) {
    GTEST_SKIP() << "its copies race with the stream's fills on purpose (that is what it "
                    "detects), which ThreadSanitizer reports";
  }
  TempDir dir;
  const auto data = test::pattern_bytes((96 << 20) / test::kShrink, 66);
  test::write_file(dir / "f.bin", data);
  RouteReport r;
  const int wrong = rounds_out_of_order(*this, dir / "f.bin", data, 1, &r, false);
  EXPECT_GT(wrong, 0) << "every round matched although the requests did not wait";
}

// Reads of many tasks each, queued back to back on the stream with the stream's earlier work held
// by the gate, in a fresh process (the first read's workers pin their staging while the stream
// waits for that read). Every read must complete, in order. Memory is allocated before the gate
// closes: CUDA's pinned and device allocations may wait for the device, which would wait for the
// gate this thread opens. It hung on the GPU machine with copies on ferry's own streams
// (bench/results/2026-12-01-5a25d25-h200-hostfunc, -875db52-h200-reserved), and on the test
// double of libcuda with them, where a copy stream shared the waiting stream's hardware queue
// (bench/NOTES.md §17). With copies on the caller's stream, one wait and one copy per task
// (129 operations a read), the H200 blocked the caller in the 8th read_async: CUDA lets about a
// thousand operations wait on a stream (the double models it); copies now go by groups of tasks.
// The 24 reads stage 192 MiB, under the bound on staging in flight. Under a sanitizer the reads
// and their tasks are a quarter of that size: still 64 tasks a read.
TEST_P(GpuStream, ManyMultiTaskReadsQueuedBackToBackAllComplete) {
  TempDir dir;
  const std::size_t size = (8 << 20) / test::kShrink;
  const std::size_t file_size = (32 << 20) / test::kShrink;
  static_assert(24 * (8 << 20) <= cuda::StagedCopies::kStagingInFlight);
  const auto data = test::pattern_bytes(file_size, 65);
  test::write_file(dir / "f.bin", data);
  const cuda::Driver& d = cuda::driver();
  FileOptions options;
  options.settings.set("task_size", test::shrunk(128 << 10));
  File f(dir / "f.bin", "r", options);
  constexpr int kRounds = 24;
  Buffer fill(MemoryKind::kHostPinned, size, 0);
  std::memset(fill.data(), 0xAA, size);
  Buffer gpu0(MemoryKind::kDevice, size, 0);
  Buffer gpu1(MemoryKind::kDevice, size, 0);
  std::vector<Buffer> out;
  at("allocating");
  for (int i = 0; i < kRounds; ++i) out.emplace_back(MemoryKind::kHostPinned, size, 0);
  std::vector<IoFuture> futures;
  hold_until(1);
  for (int i = 0; i < kRounds; ++i) {
    const Buffer& gpu = i % 2 == 0 ? gpu0 : gpu1;
    at("queueing the fill", i);
    ASSERT_EQ(d.MemcpyHtoDAsync(dptr(gpu), fill.data(), size, stream_), abi::kSuccess);
    at("in read_async", i);
    futures.push_back(f.read_async(gpu.data(), size, (i % 4) * size, stream_handle()));
    at("queueing the copy out", i);
    ASSERT_EQ(d.MemcpyDtoHAsync(out[i].data(), dptr(gpu), size, stream_), abi::kSuccess);
  }
  open_gate(1);
  at("synchronising the stream");
  ASSERT_EQ(d.StreamSynchronize(stream_), abi::kSuccess);
  at("checking");
  for (int i = 0; i < kRounds; ++i) {
    ASSERT_EQ(futures[i].get(), size);
    EXPECT_GE(futures[i].route().tasks, 64u);
    ASSERT_EQ(0, std::memcmp(out[i].data(), data.data() + (i % 4) * size, size)) << "round " << i;
  }
}

// Staging in flight is bounded: with the stream held by the gate, reads that together stage more
// than the bound wait in the caller's thread for earlier ones to complete (as CUDA makes a caller
// wait who queues far ahead of the GPU) instead of pinning more; they all land once it opens.
TEST_P(GpuStream, ReadsBeyondTheStagingBoundWaitForEarlierOnesInsteadOfPinningMore) {
  TempDir dir;
  // A bound of 16 MiB proves what 256 MiB does, in 1/16 of the bytes (TSan's slowest test).
  constexpr std::size_t kBound = std::size_t{16} << 20;
  cuda::set_staging_in_flight_bound(kBound);
  struct Restore {
    ~Restore() { cuda::set_staging_in_flight_bound(cuda::StagedCopies::kStagingInFlight); }
  } restore;
  const std::size_t size = kBound / 4;
  constexpr int kReads = 6;
  const auto data = test::pattern_bytes(size + kReads * 4096, 68);
  test::write_file(dir / "f.bin", data);
  const cuda::Driver& d = cuda::driver();
  File f(dir / "f.bin");
  std::vector<Buffer> gpu;
  std::vector<Buffer> out;
  for (int i = 0; i < kReads; ++i) {
    gpu.emplace_back(MemoryKind::kDevice, size, 0);
    out.emplace_back(MemoryKind::kHostPinned, size, 0);
  }
  hold_until(1);
  std::vector<IoFuture> futures(kReads);
  std::atomic<int> returned{0};
  std::atomic<bool> opened{false};
  std::atomic<bool> returned_while_shut{false};
  std::thread caller([&] {
    cuda::use_device(0);
    for (int i = 0; i < kReads; ++i) {
      futures[i] = f.read_async(gpu[i].data(), size, i * 4096, stream_handle());
      if (i >= 4 && !opened.load()) returned_while_shut.store(true);
      EXPECT_EQ(d.MemcpyDtoHAsync(out[i].data(), dptr(gpu[i]), size, stream_), abi::kSuccess);
      returned.fetch_add(1);
    }
  });
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (returned.load() < 4 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(returned.load(), 4) << "four reads of a quarter of the bound each did not all start";
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(returned.load(), 4) << "a fifth read started while the gate held the first four";
  EXPECT_LE(cuda::staging_in_flight(), kBound);
  opened.store(true);
  open_gate(1);
  caller.join();
  EXPECT_FALSE(returned_while_shut.load());
  ASSERT_EQ(d.StreamSynchronize(stream_), abi::kSuccess);
  for (int i = 0; i < kReads; ++i) {
    ASSERT_EQ(futures[i].get(), size);
    ASSERT_EQ(0, std::memcmp(out[i].data(), data.data() + i * 4096, size)) << "read " << i;
  }
  EXPECT_EQ(cuda::staging_in_flight(), 0u);
}

// The file is read into staging while the stream's earlier work still holds the copies back:
// every byte is read with the gate closed, the request completes only once the gate opens and
// the stream has copied, and the bytes are the file's. The size and the tasks shrink alike under
// a sanitizer.
TEST_P(GpuStream, ReadIsStagedWhileEarlierWorkRunsAndCompletesAfterTheCopies) {
  TempDir dir;
  const std::size_t size = (24 << 20) / test::kShrink + 5;
  const auto data = test::pattern_bytes(size, 67);
  test::write_file(dir / "f.bin", data);
  FileOptions options;
  options.settings.set("task_size", test::shrunk(1 << 20));
  File f(dir / "f.bin", "r", options);
  Buffer gpu(MemoryKind::kDevice, size, 0);
  std::vector<unsigned char> out(size);
  hold_until(1);
  IoFuture r = f.read_async(gpu.data(), size, 0, stream_handle());
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (r.progress() < size && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(r.progress(), size) << "the workers did not read the file while the gate was shut";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(r.ready()) << "completed before the stream copied the staging";
  open_gate(1);
  EXPECT_EQ(r.get(), size);
  ASSERT_EQ(cuda::driver().StreamSynchronize(stream_), abi::kSuccess);
  gpu.copy_to_host(out.data(), size, 0);
  EXPECT_EQ(out, data);
  EXPECT_NE(r.route().to_text().find("pinned staging"), std::string::npos) << r.route().to_text();
  EXPECT_EQ(cuda::stream_gates_in_use(), 0u);
}

// Strict mode: a stream-ordered request on GPU memory runs on ferry's POSIX path through its
// staging, so require=cufile refuses it before queueing anything, naming the setting.
TEST_P(GpuStream, RequireCufileRefusesAStreamOrderedGpuRead) {
  TempDir dir;
  test::write_file(dir / "f.bin", test::pattern_bytes(1 << 20, 68));
  FileOptions options;
  options.settings.set("require", "cufile");
  File f(dir / "f.bin", "r", options);
  Buffer gpu(MemoryKind::kDevice, 1 << 20, 0);
  IoFuture r = f.read_async(gpu.data(), 1 << 20, 0, stream_handle());
  try {
    r.get();
    ADD_FAILURE() << "a strict stream-ordered read ran";
  } catch (const RouteError& e) {
    EXPECT_NE(std::string(e.what()).find("require=cufile"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cuda::stream_gates_in_use(), 0u);
  EXPECT_EQ(cuda::driver().StreamSynchronize(stream_), abi::kSuccess);
}

// [gate] earlier work writes the pattern into the buffer; write_async; later work overwrites the
// buffer with 0xAA. The file must hold the pattern.
TEST_P(GpuStream, WriteReadsTheBufferAfterTheEarlierWorkAndBeforeTheLaterWork) {
  TempDir dir;
  const std::size_t size = (8 << 20) + 999;
  const auto data = test::pattern_bytes(size, 63);
  const cuda::Driver& d = cuda::driver();
  Buffer src(MemoryKind::kHostPinned, size, 0);
  std::memcpy(src.data(), data.data(), size);
  Buffer fill(MemoryKind::kHostPinned, size, 0);
  std::memset(fill.data(), 0xAA, size);
  Buffer gpu(MemoryKind::kDevice, size, 0);
  gpu.fill(0x55);
  ASSERT_EQ(d.StreamSynchronize(nullptr), abi::kSuccess);
  {
    File f(dir / "w.bin", "w");
    hold_until(1);
    ASSERT_EQ(d.MemcpyHtoDAsync(dptr(gpu), src.data(), size, stream_), abi::kSuccess);
    IoFuture w = f.write_async(gpu.data(), size, 0, stream_handle());
    ASSERT_EQ(d.MemcpyHtoDAsync(dptr(gpu), fill.data(), size, stream_), abi::kSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    open_gate(1);
    ASSERT_EQ(w.get(), size);
    ASSERT_EQ(d.StreamSynchronize(stream_), abi::kSuccess);
  }
  EXPECT_EQ(test::read_file(dir / "w.bin"), data);
}

// A request that fails in its workers, one that fails before any I/O, and one cancelled while
// the stream holds it back: the stream always goes on, and every gate comes back.
TEST_P(GpuStream, FailedAndCancelledRequestsReleaseTheStream) {
  TempDir dir;
  const auto data = test::pattern_bytes(32 << 20, 64);
  test::write_file(dir / "f.bin", data);
  const cuda::Driver& d = cuda::driver();
  Buffer gpu(MemoryKind::kDevice, data.size(), 0);
  {
    File w(dir / "f.bin", "a");  // not readable: fails before any I/O, nothing queued
    IoFuture e = w.read_async(gpu.data(), data.size(), 0, stream_handle());
    EXPECT_THROW(e.get(), IoError);
  }
  File f(dir / "f.bin");
  hold_until(1);
  IoFuture c = f.read_async(gpu.data(), data.size(), 0, stream_handle());
  EXPECT_TRUE(c.cancel());
  open_gate(1);
  try {
    c.get();  // cancelled, or complete if every byte had moved first
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), ECANCELED);
  }
  ASSERT_EQ(d.StreamSynchronize(stream_), abi::kSuccess);
  EXPECT_EQ(cuda::stream_gates_in_use(), 0u);
}

// Several streams, each held by a gate of its own, with reads queued on them from several threads
// at once; the gates open in the reverse order of the streams' creation, after every read was
// queued. No wait on any stream depends on GPU work queued after it, so whichever hardware queue
// each stream shares (FakeGpu1: all of them one), every read lands, in its stream's order.
TEST(GpuStreams, ReadsOnManyHeldStreamsFromManyThreadsAllLand) {
  CudaStatus cuda = cuda_status();
  if (!cuda.available || cuda.gpus.empty()) GTEST_SKIP() << "no GPU: " << cuda.why_not;
  const cuda::Driver& d = cuda::driver();
  cuda::use_device(0);
  TempDir dir;
  const std::size_t size = (3 << 20) / test::kShrink + 1000;  // 7 tasks, shrunk or not
  const auto data = test::pattern_bytes(size * 4, 69);
  test::write_file(dir / "f.bin", data);
  constexpr int kStreams = 3;
  constexpr int kReads = 8;
  void* page = nullptr;
  ASSERT_EQ(d.MemHostAlloc(&page, 4096, abi::kMemHostAllocPortable | abi::kMemHostAllocDeviceMap),
            abi::kSuccess);
  std::memset(page, 0, 4096);
  auto* gate = static_cast<std::uint32_t*>(page);
  std::vector<abi::Stream> streams(kStreams);
  std::vector<Buffer> gpu;
  std::vector<Buffer> out;
  for (int s = 0; s < kStreams; ++s) {
    ASSERT_EQ(d.StreamCreate(&streams[s], abi::kStreamDefault), abi::kSuccess);
    gpu.emplace_back(MemoryKind::kDevice, size, 0);
    for (int r = 0; r < kReads; ++r) out.emplace_back(MemoryKind::kHostPinned, size, 0);
  }
  std::atomic<bool> finished{false};
  std::atomic<bool> fired{false};
  std::thread watchdog([&] {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!finished.load() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (finished.load()) return;
    fired.store(true);
    for (int s = 0; s < kStreams; ++s) std::atomic_ref<std::uint32_t>(gate[s]).store(1);
  });
  FileOptions options;
  options.settings.set("task_size", test::shrunk(512 << 10));
  File f(dir / "f.bin", "r", options);
  std::vector<std::vector<IoFuture>> futures(kStreams);
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] {
      cuda::use_device(0);
      abi::DevicePtr g = 0;
      ASSERT_EQ(d.MemHostGetDevicePointer(&g, &gate[s], 0), abi::kSuccess);
      ASSERT_EQ(d.StreamWaitValue32(streams[s], g, 1, abi::kStreamWaitValueGeq), abi::kSuccess);
      for (int r = 0; r < kReads; ++r) {
        const std::uint64_t at = ((s + r) % 4) * size;
        futures[s].push_back(f.read_async(gpu[s].data(), size, at, streams[s]));
        ASSERT_EQ(d.MemcpyDtoHAsync(out[s * kReads + r].data(), dptr(gpu[s]), size, streams[s]),
                  abi::kSuccess);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int s = kStreams - 1; s >= 0; --s) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::atomic_ref<std::uint32_t>(gate[s]).store(1);
  }
  for (int s = 0; s < kStreams; ++s) EXPECT_EQ(d.StreamSynchronize(streams[s]), abi::kSuccess);
  finished.store(true);
  watchdog.join();
  EXPECT_FALSE(fired.load()) << "a stream did not pass its reads until the watchdog opened it";
  for (int s = 0; s < kStreams; ++s) {
    for (int r = 0; r < kReads; ++r) {
      EXPECT_EQ(futures[s][r].get(), size);
      const std::uint64_t at = ((s + r) % 4) * size;
      EXPECT_EQ(0, std::memcmp(out[s * kReads + r].data(), data.data() + at, size))
          << "stream " << s << " read " << r;
    }
    d.StreamDestroy(streams[s]);
  }
  d.MemFreeHost(page);
  EXPECT_EQ(cuda::stream_gates_in_use(), 0u);
}

std::string stream_name(const ::testing::TestParamInfo<bool>& p) {
  return p.param ? "LegacyDefaultStream" : "OwnStream";
}
INSTANTIATE_TEST_SUITE_P(Streams, GpuStream, ::testing::Values(false, true), stream_name);

}  // namespace
}  // namespace ferry
