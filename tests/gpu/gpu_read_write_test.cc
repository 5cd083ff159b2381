// Reads into and writes from every kind of memory ferry classifies (device, managed, pinned,
// pageable), at unaligned sizes and buffer offsets, byte for byte against a host reference.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "backends/default_runtime.h"
#include "core/open_file.h"
#include "core/runtime_state.h"
#include "cuda/cuda_driver.h"
#include "ferry/ferry.h"
#include "io/io_seam.h"
#include "pass_through_io.h"
#include "test_hooks.h"
#include "test_util.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using test::TempDir;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    CudaStatus cuda = cuda_status();
    if (!cuda.available || cuda.gpus.empty()) {
      GTEST_SKIP() << "no GPU: " << (cuda.why_not.empty() ? "no device" : cuda.why_not);
    }
  }
};

std::vector<unsigned char> copy_back(const Buffer& b, std::size_t offset, std::size_t size) {
  std::vector<unsigned char> host(size);
  b.copy_to_host(host.data(), size, offset);
  return host;
}

const MemoryKind kKinds[] = {MemoryKind::kDevice, MemoryKind::kManaged, MemoryKind::kHostPinned,
                             MemoryKind::kHostPageable};

TEST_F(Gpu, ClassifiesEveryKindOfMemory) {
  for (MemoryKind kind : kKinds) {
    Buffer b(kind, 4096, 0);
    MemoryInfo info = classify_memory(static_cast<char*>(b.data()) + 100);
    EXPECT_EQ(info.kind, kind) << to_string(kind);
    if (kind != MemoryKind::kHostPageable) {
      EXPECT_EQ(info.device, 0);
    }
  }
}

// Many ranges into many device allocations as one request (how checkpoints load), buffered
// and O_DIRECT, with small and large tasks; nothing outside the ranges is written. Under a
// sanitizer the file and the ranges shrink (test::kShrink), and the tasks do not: 64 KiB tasks
// would take another path (posix_backend.cc's kSharedSlotTask). A range still spans up to four
// small tasks.
TEST_F(Gpu, GatherIntoManyDeviceAllocationsMatchesTheFile) {
  TempDir dir;
  const std::size_t file_size = (48 << 20) / test::kShrink + 333;
  auto data = test::pattern_bytes(file_size, 51);
  test::write_file(dir / "g.bin", data);
  std::mt19937_64 rng(52);
  for (bool direct : {false, true}) {
    for (const char* task : {"256KiB", "4MiB"}) {
      FileOptions options;
      options.direct = direct;
      options.settings.set("task_size", task);
      File f(dir / "g.bin", "r", options);
      std::vector<Buffer> buffers;
      std::vector<ReadRange> ranges;
      std::uint64_t total = 0;
      for (int i = 0; i < 60; ++i) {
        const std::size_t size =
            i % 7 == 0 ? rng() % 64 + 1 : rng() % ((3 << 20) / test::kShrink) + 1;
        const std::uint64_t offset = rng() % (file_size - size + 1);
        buffers.emplace_back(MemoryKind::kDevice, size + 512, 0);
        buffers.back().fill(0xEE);
        ranges.push_back({offset, size, static_cast<char*>(buffers.back().data()) + 256});
        total += size;
      }
      IoFuture fut = f.pread_gather(ranges);
      ASSERT_EQ(fut.get(), total);
      EXPECT_EQ(fut.route().memory, MemoryKind::kDevice);
      for (std::size_t i = 0; i < ranges.size(); ++i) {
        auto back = copy_back(buffers[i], 0, ranges[i].size + 512);
        ASSERT_EQ(
            0, std::memcmp(back.data() + 256, data.data() + ranges[i].file_offset, ranges[i].size))
            << "range " << i << " task " << task << (direct ? " direct" : "");
        for (std::size_t k = 0; k < 256; ++k) ASSERT_EQ(back[k], 0xEE) << "before range " << i;
        for (std::size_t k = 256 + ranges[i].size; k < back.size(); ++k) {
          ASSERT_EQ(back[k], 0xEE) << "after range " << i;
        }
      }
    }
  }
  // Host and device buffers in one request are refused before any I/O.
  File f(dir / "g.bin");
  Buffer gpu(MemoryKind::kDevice, 4096, 0);
  std::vector<unsigned char> host(4096);
  std::vector<ReadRange> mixed = {{0, 4096, gpu.data()}, {4096, 4096, host.data()}};
  test::expect_io_error([&] { f.pread_gather(mixed).get(); }, (dir / "g.bin").string(), EINVAL);
}

// Regression (issue 29): `ferry load --gpu` failed on every transformers-saved checkpoint with
// "cuMemcpyHtoDAsync: CUDA_ERROR_INVALID_VALUE". Its small tensors (norms, biases) are separate
// cuMemAlloc allocations that CUDA packs next to each other, stored next to each other in the
// file; the worker merged the copies of rows adjacent in the buffer, and a copy spanning two
// allocations is refused. One request gathers into many small adjacent allocations here.
TEST_F(Gpu, GatherIntoAdjacentSmallAllocationsCopiesEachOnItsOwn) {
  TempDir dir;
  const std::size_t kTensor = 8 << 10;  // an 8 KiB norm, as in a Mistral-family model
  const int kCount = 24;
  auto data = test::pattern_bytes(kTensor * kCount, 29);
  test::write_file(dir / "shard.bin", data);
  std::vector<Buffer> tensors;
  std::vector<ReadRange> ranges;
  int adjacent = 0;
  for (int i = 0; i < kCount; ++i) {
    tensors.emplace_back(MemoryKind::kDevice, kTensor, 0);
    tensors.back().fill(0xEE);
    ranges.push_back({static_cast<std::uint64_t>(i) * kTensor, kTensor, tensors.back().data()});
    if (i > 0 && static_cast<char*>(tensors[i - 1].data()) + kTensor == tensors[i].data())
      ++adjacent;
  }
  // What the failure needs, on a GPU as on the double: allocations that follow each other.
  ASSERT_GT(adjacent, 0) << "no two allocations were adjacent: the case is not exercised";
  File f(dir / "shard.bin");
  IoFuture fut = f.pread_gather(ranges);
  ASSERT_EQ(fut.get(), data.size());
  for (int i = 0; i < kCount; ++i) {
    auto back = copy_back(tensors[i], 0, kTensor);
    ASSERT_EQ(0, std::memcmp(back.data(), data.data() + i * kTensor, kTensor)) << "tensor " << i;
  }
}

// A scattered write from many device allocations as one request (how a checkpoint would be
// saved), buffered and O_DIRECT: every range lands at its offset, the holes read as zeros. Sizes,
// tasks and staging shrink alike under a sanitizer.
TEST_F(Gpu, ScatterFromManyDeviceAllocationsWritesEveryRange) {
  TempDir dir;
  std::mt19937_64 rng(53);
  for (bool direct : {false, true}) {
    FileOptions options;
    options.direct = direct;
    options.settings.set("task_size", test::shrunk(1 << 20));
    options.settings.set("bounce_buffer_size", test::shrunk(4 << 20));  // the default
    std::vector<Buffer> buffers;
    std::vector<std::vector<unsigned char>> sources;
    std::vector<WriteRange> ranges;
    std::uint64_t at = 4096;
    std::uint64_t total = 0;
    for (int i = 0; i < 40; ++i) {
      const std::size_t size =
          i % 7 == 0 ? rng() % 64 + 1 : rng() % ((3 << 20) / test::kShrink) + 1;
      sources.push_back(test::pattern_bytes(size, 60 + i));
      buffers.emplace_back(MemoryKind::kDevice, size + 512, 0);
      buffers.back().copy_from_host(sources.back().data(), size, 256);
      ranges.push_back({at, size, static_cast<char*>(buffers.back().data()) + 256});
      at += size + rng() % 10000;
      total += size;
    }
    {
      File f(dir / "s.bin", "w", options);
      IoFuture fut = f.pwrite_scatter(ranges);
      ASSERT_EQ(fut.get(), total);
      EXPECT_EQ(fut.route().memory, MemoryKind::kDevice);
    }
    auto back = test::read_file(dir / "s.bin");
    ASSERT_EQ(back.size(), ranges.back().file_offset + ranges.back().size);
    for (std::size_t k = 0; k < 4096; ++k) ASSERT_EQ(back[k], 0) << "the hole before range 0";
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      ASSERT_EQ(0,
                std::memcmp(back.data() + ranges[i].file_offset, sources[i].data(), ranges[i].size))
          << "range " << i << (direct ? " direct" : "");
    }
  }
}

// Idle pinned staging is given back on request, the caller's CUDA context is left as it was,
// and the next read into GPU memory makes new staging.
TEST_F(Gpu, IdleStagingIsFreedAndTheCallersContextIsKept) {
  TempDir dir;
  const auto data = test::pattern_bytes((64 << 20) / test::kShrink, 54);
  test::write_file(dir / "f.bin", data);
  Runtime runtime;
  FileOptions options;
  options.runtime = &runtime;
  options.settings.set("task_size", test::shrunk(4 << 20));  // the default, shrunk alike
  options.settings.set("bounce_buffer_size", test::shrunk(4 << 20));
  Buffer gpu(MemoryKind::kDevice, data.size(), 0);
  {
    File f(dir / "f.bin", "r", options);
    ASSERT_EQ(f.read(gpu.data(), data.size(), 0), data.size());
  }
  const std::size_t idle = runtime.idle_staging();
  ASSERT_GT(idle, 0u);
  const cuda::Driver& d = cuda::driver();
  cuda::abi::Context before = nullptr;
  ASSERT_EQ(d.CtxGetCurrent(&before), cuda::abi::kSuccess);
  EXPECT_EQ(runtime.free_idle_staging(), idle * 2 * ((4u << 20) / test::kShrink));
  cuda::abi::Context after = nullptr;
  ASSERT_EQ(d.CtxGetCurrent(&after), cuda::abi::kSuccess);
  EXPECT_EQ(after, before);
  EXPECT_EQ(runtime.idle_staging(), 0u);
  gpu.fill(0);
  {
    File f(dir / "f.bin", "r", options);
    ASSERT_EQ(f.read(gpu.data(), data.size(), 0), data.size());
  }
  EXPECT_EQ(copy_back(gpu, 0, data.size()), data);
}

TEST_F(Gpu, ReadsUnalignedSizesAtBufferOffsetsIntoEveryKind) {
  TempDir dir;
  // 16 tasks of 1 MiB, each through bounce buffers of 256 KiB, for the largest read: every size
  // class of the test. 64 MiB checked nothing more and took 25 s of CTest on the libcuda double.
  // All three shrink alike under a sanitizer.
  const std::size_t file_size = (16 << 20) / test::kShrink + 4099;
  auto data = test::pattern_bytes(file_size, 41);
  test::write_file(dir / "g.bin", data);
  std::mt19937_64 rng(42);
  for (bool direct : {false, true}) {
    FileOptions options;
    options.direct = direct;
    options.settings.set("task_size", test::shrunk(1 << 20));
    options.settings.set("bounce_buffer_size", test::shrunk(256 << 10));
    File file(dir / "g.bin", "r", options);
    for (MemoryKind kind : kKinds) {
      for (std::size_t size : {std::size_t{1}, std::size_t{4095},
                               (std::size_t{4} << 20) / test::kShrink + 1, file_size - 3}) {
        std::size_t buffer_offset = rng() % 512;
        std::uint64_t offset = std::min<std::uint64_t>(rng() % 8192, file_size - size);
        Buffer b(kind, size + buffer_offset + 64, 0);
        b.fill(0xAB);
        IoFuture f = file.pread(static_cast<char*>(b.data()) + buffer_offset, size, offset);
        ASSERT_EQ(f.get(), size) << to_string(kind) << " size " << size;
        auto back = copy_back(b, 0, b.size());
        ASSERT_EQ(0, std::memcmp(back.data() + buffer_offset, data.data() + offset, size))
            << to_string(kind) << " size " << size << " offset " << offset << " direct " << direct;
        for (std::size_t i = 0; i < buffer_offset; ++i) ASSERT_EQ(back[i], 0xAB);
        for (std::size_t i = buffer_offset + size; i < back.size(); ++i) ASSERT_EQ(back[i], 0xAB);
        RouteReport r = f.route();
        EXPECT_EQ(r.memory, kind);
        EXPECT_EQ(r.bytes, size);
      }
    }
  }
}

TEST_F(Gpu, WritesFromEveryKindReadBackExactly) {
  TempDir dir;
  const std::size_t size = (16 << 20) / test::kShrink + 333;  // with the task size, shrunk
  auto data = test::pattern_bytes(size, 43);
  for (bool direct : {false, true}) {
    for (MemoryKind kind : kKinds) {
      Buffer b(kind, size + 7, 0);
      b.copy_from_host(data.data(), size, 7);
      FileOptions options;
      options.direct = direct;
      options.settings.set("task_size", test::shrunk(1 << 20));
      {
        File file(dir / "w.bin", "w", options);
        EXPECT_EQ(file.write(static_cast<char*>(b.data()) + 7, size, 5), size);
      }
      auto back = test::read_file(dir / "w.bin");
      ASSERT_EQ(back.size(), size + 5);
      EXPECT_EQ(0, std::memcmp(back.data() + 5, data.data(), size))
          << to_string(kind) << " direct " << direct;
    }
  }
}

// With the default 4 MiB tasks a write from GPU memory is cut into chunks whose copies overlap the
// previous chunk's write (write_from_gpu): buffered and O_DIRECT, from an unaligned offset, with a
// task that ends inside a chunk. Under a sanitizer the write is three tasks instead of eleven, of
// the same size: a chunk is 1 MiB at least (posix_backend.cc's gpu_chunk), so smaller tasks
// would be one chunk each.
TEST_F(Gpu, WritesFromGpuMemoryInOverlappingChunksLandInOrder) {
  TempDir dir(std::filesystem::current_path().string());  // a file system that takes O_DIRECT
  const std::size_t size = (40 << 20) / test::kShrink + 4096 * 3 + 77;
  auto data = test::random_bytes(size, 47);
  Buffer b(MemoryKind::kDevice, size + 13, 0);
  b.copy_from_host(data.data(), size, 13);
  for (bool direct : {false, true}) {
    FileOptions options;
    options.direct = direct;
    {
      File file(dir / "c.bin", "w", options);
      IoFuture w = file.pwrite(static_cast<char*>(b.data()) + 13, size, 4096);
      EXPECT_EQ(w.get(), size);
      EXPECT_EQ(w.route().tasks, (size + (4 << 20) - 1) / (4 << 20));
    }
    auto back = test::read_file(dir / "c.bin");
    ASSERT_EQ(back.size(), size + 4096);
    EXPECT_EQ(0, std::memcmp(back.data() + 4096, data.data(), size)) << "direct " << direct;
  }
}

// The system calls, with a hook run before each pwrite.
class PwriteHook final : public test::PassThroughIo {
 public:
  explicit PwriteHook(std::function<void(std::uint64_t offset, std::size_t size)> hook)
      : hook_(std::move(hook)) {}
  ssize_t pwrite(int fd, const void* buf, size_t size, off_t offset) override {
    hook_(static_cast<std::uint64_t>(offset), size);
    return io::system_io().pwrite(fd, buf, size, offset);
  }

 private:
  std::function<void(std::uint64_t, std::size_t)> hook_;
};

// cuCtxSynchronize of the libcuda ferry loaded (ferry itself never calls it).
using CtxSynchronizeFn = int (*)();
CtxSynchronizeFn ctx_synchronize() {
  const char* lib = std::getenv("FERRY_CUDA_LIBRARY");
  void* h = dlopen(lib != nullptr ? lib : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return h != nullptr ? reinterpret_cast<CtxSynchronizeFn>(dlsym(h, "cuCtxSynchronize")) : nullptr;
}

// One buffered writer copies the next task's first chunk from the GPU while it writes the last
// chunk of the task before (run_then), so no copy waits between tasks. Seen from a hook before
// each task's last pwrite: once every copy queued so far has run, the next task's first bytes
// are changed on the GPU; the file must hold the bytes from before the change, which it does
// only if that chunk was copied out before the hook ran. Past the first chunk, the chunks are
// whole staging slots: the first task goes as 1 MiB (a quarter, which nothing overlaps) and
// 3 MiB, every later one in one pwrite.
TEST_F(Gpu, OneWriterCopiesTheNextTasksFirstChunkDuringTheLastWriteOfTheTaskBefore) {
  CtxSynchronizeFn sync = ctx_synchronize();
  if (sync == nullptr) GTEST_SKIP() << "cuCtxSynchronize not found in the loaded libcuda";
  TempDir dir;
  constexpr std::size_t kTask = 4 << 20, kChunk = 1 << 20, kTasks = 4;
  const std::size_t size = kTask * kTasks;
  auto data = test::random_bytes(size, 53);
  const std::vector<unsigned char> other(kChunk, 0xEE);
  Buffer b(MemoryKind::kDevice, size, 0);
  b.copy_from_host(data.data(), size, 0);
  const auto base = reinterpret_cast<cuda::abi::DevicePtr>(b.data());
  int changed = 0;
  std::vector<std::pair<std::uint64_t, std::size_t>> writes;
  PwriteHook io([&](std::uint64_t offset, std::size_t n) {
    writes.emplace_back(offset, n);
    // The last pwrite of tasks 0 to 2; the hook runs on the writer, whose context is current.
    const std::uint64_t end = offset + n;
    if (end % kTask != 0 || end >= size) return;
    ASSERT_EQ(sync(), 0);
    ASSERT_EQ(cuda::driver().MemcpyHtoD(base + end, other.data(), kChunk), 0);
    ++changed;
  });
  {
    FileOptions options;
    options.settings.set("nthreads", "1");
    options.settings.set("bounce_buffer_size", "4MiB");
    File file = test::FileTestHelper::open(dir / "n.bin", "w", options, io);
    IoFuture w = file.pwrite(b.data(), size, 0);
    EXPECT_EQ(w.get(), size);
    EXPECT_EQ(w.route().workers, 1u);
    EXPECT_EQ(w.route().tasks, kTasks);
  }
  EXPECT_EQ(changed, 3);
  const std::vector<std::pair<std::uint64_t, std::size_t>> expected = {{0, kChunk},
                                                                       {kChunk, kTask - kChunk},
                                                                       {kTask, kTask},
                                                                       {2 * kTask, kTask},
                                                                       {3 * kTask, kTask}};
  EXPECT_EQ(writes, expected);
  auto back = test::read_file(dir / "n.bin");
  ASSERT_EQ(back.size(), size);
  for (std::size_t t = 1; t < kTasks; ++t) {
    EXPECT_EQ(0, std::memcmp(back.data() + t * kTask, data.data() + t * kTask, kChunk))
        << "task " << t << "'s first chunk was copied from the GPU after the task before ended";
  }
  EXPECT_EQ(0, std::memcmp(back.data(), data.data(), size));
}

// A buffered write from GPU memory runs on one writer whatever the thread setting (the cap of
// PosixBackend::max_workers; bench/NOTES.md §4), and the report says so.
TEST_F(Gpu, ABufferedWriteFromGpuMemoryRunsOnOneWriter) {
  TempDir dir;
  const std::size_t size = (32 << 20) / test::kShrink + 512;  // 3 tasks or more, shrunk or not
  auto data = test::random_bytes(size, 61);
  Buffer b(MemoryKind::kDevice, size, 0);
  b.copy_from_host(data.data(), size, 0);
  FileOptions options;
  options.settings.set("nthreads", "8");
  File file(dir / "w.bin", "w", options);
  IoFuture w = file.pwrite(b.data(), size, 0);
  EXPECT_EQ(w.get(), size);
  EXPECT_EQ(w.route().workers, 1u);
  EXPECT_GT(w.route().tasks, 1u);
  file.close();
  auto back = test::read_file(dir / "w.bin");
  ASSERT_EQ(back.size(), size);
  EXPECT_EQ(0, std::memcmp(back.data(), data.data(), size));
}

// Writers that look ahead still yield their one thread to a request waiting to start (the
// engine never yields with a task claimed ahead): two callers' writes from GPU memory share a
// pool of one thread, task by task, and every byte of both lands.
TEST_F(Gpu, WritesThatLookAheadShareOneThreadAndLoseNoTask) {
  TempDir dir;
  const std::size_t size = (24 << 20) / test::kShrink + 4097;  // with the task size, shrunk
  auto data = test::random_bytes(size, 59);
  Buffer b(MemoryKind::kDevice, size, 0);
  b.copy_from_host(data.data(), size, 0);
  FileOptions options;
  options.settings.set("nthreads", "1");
  options.settings.set("task_size", test::shrunk(1 << 20));
  File one(dir / "one.bin", "w", options);
  File two(dir / "two.bin", "w", options);
  for (int round = 0; round < 3; ++round) {
    IoFuture a = one.pwrite(b.data(), size, 0);
    IoFuture c = two.pwrite(b.data(), size, 0);
    EXPECT_EQ(a.get(), size);
    EXPECT_EQ(c.get(), size);
  }
  for (const char* name : {"one.bin", "two.bin"}) {
    auto back = test::read_file(dir / name);
    ASSERT_EQ(back.size(), size);
    EXPECT_EQ(0, std::memcmp(back.data(), data.data(), size)) << name;
  }
}

TEST_F(Gpu, ReadsEightGibUnalignedIntoDeviceMemory) {
  if (test::on_fake_cuda()) GTEST_SKIP() << "sized for a GPU: the fake keeps device memory in RAM";
  TempDir dir;
  const std::size_t size = (std::size_t{8} << 30) + 3;
  auto data = test::pattern_bytes(size, 44);
  test::write_file(dir / "big.bin", data);
  Buffer b(MemoryKind::kDevice, size, 0);
  File file(dir / "big.bin");
  IoFuture f = file.pread(b.data(), size, 0);
  ASSERT_EQ(f.get(), size);
  EXPECT_EQ(f.route().tasks, (size + (4 << 20) - 1) / (4 << 20));
  std::vector<unsigned char> chunk(std::size_t{256} << 20);
  for (std::size_t off = 0; off < size; off += chunk.size()) {
    std::size_t n = std::min(chunk.size(), size - off);
    b.copy_to_host(chunk.data(), n, off);
    ASSERT_EQ(0, std::memcmp(chunk.data(), data.data() + off, n)) << "at offset " << off;
  }
}

TEST_F(Gpu, RouteReportNamesTheBouncePathForGpuMemory) {
  TempDir dir;
  test::write_file(dir / "r.bin", test::pattern_bytes(8 << 20, 45));
  Buffer b(MemoryKind::kDevice, 8 << 20, 0);
  SettingsOverride o;
  o.compat_mode = CompatMode::kOn;
  File file(dir / "r.bin", "r", FileOptions{false, o});
  IoFuture f = file.pread(b.data(), 8 << 20, 0);
  f.get();
  RouteReport r = f.route();
  EXPECT_EQ(r.memory, MemoryKind::kDevice);
  EXPECT_EQ(r.device, 0);
  EXPECT_EQ(r.posix_tasks, 2u);
  bool engine = false;
  for (const RouteReason& reason : r.reasons) {
    if (reason.code == ReasonCode::kEngine) {
      engine = true;
      EXPECT_NE(reason.text.find("pinned staging buffers"), std::string::npos) << reason.text;
    }
  }
  EXPECT_TRUE(engine);
}

// Issue 6: a device pointer whose context was destroyed. CTest runs each test in its own
// process, so resetting the primary context here harms no other test.
TEST_F(Gpu, PointerFromADestroyedContextIsAClearErrorNotACrash) {
  TempDir dir;
  const std::size_t size = 1 << 20;
  test::write_file(dir / "d.bin", test::pattern_bytes(size, 46));
  void* stale = nullptr;
  {
    Buffer b(MemoryKind::kDevice, size, 0);
    stale = b.data();
    const cuda::Driver& d = cuda::driver();
    cuda::abi::Device dev = 0;
    ASSERT_EQ(d.DeviceGet(&dev, 0), cuda::abi::kSuccess);
    ASSERT_EQ(d.DevicePrimaryCtxReset(dev), cuda::abi::kSuccess);  // frees every allocation in it
    // The Buffer's own cuMemFree then fails quietly: the memory is already gone.
  }
  File file(dir / "d.bin");
  try {
    std::size_t n = file.read(stale, size, 0);
    FAIL() << "a read into freed device memory reported " << n << " bytes";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EFAULT) << e.what();
    EXPECT_NE(std::string(e.what()).find("d.bin"), std::string::npos) << e.what();
  } catch (const CudaError& e) {
    SUCCEED() << e.what();
  }
}

// One-task requests into GPU memory that ferry's POSIX path takes on cheap facts (below the
// threshold, or cuFile limited to its compatibility path) run in the caller's thread; their
// reports say what explain() predicts and the bytes are exact, for reads and writes.
TEST_F(Gpu, SmallRequestsIntoGpuMemoryRunInTheCallersThreadWithTheirRoute) {
  TempDir dir;
  auto data = test::random_bytes(8 << 20, 45);
  test::write_file(dir / "s.bin", data);
  File file(dir / "s.bin", "r+");
  Buffer b(MemoryKind::kDevice, 8 << 20, 0);
  for (std::size_t size : {std::size_t{1}, std::size_t{4096}, std::size_t{65536},
                           (std::size_t{1} << 20) + 7, std::size_t{4} << 20}) {
    const std::uint64_t offset = 12345;
    b.fill(0xEE);
    ASSERT_EQ(file.read(b.data(), size, offset), size);
    auto back = copy_back(b, 0, size + 1);
    ASSERT_EQ(0, std::memcmp(back.data(), data.data() + offset, size)) << size;
    EXPECT_EQ(back[size], 0xEE) << size;
    RouteReport r = file.last_route();
    ExplainRequest q;
    q.gpu = 0;
    q.size = size;
    q.offset = offset;
    Explanation e = explain(dir / "s.bin", q);
    EXPECT_EQ(r.tasks, 1u) << size;
    ASSERT_FALSE(r.reasons.empty());
    ASSERT_FALSE(e.reasons.empty());
    EXPECT_EQ(r.reasons[0].code, e.reasons[0].code) << size << ": " << r.to_text();
    EXPECT_NE(r.to_text().find("staging buffers"), std::string::npos) << r.to_text();
    IoFuture w = file.pwrite(b.data(), std::min<std::size_t>(size, 4096), 0);
    EXPECT_EQ(w.get(), std::min<std::size_t>(size, 4096));
  }
  file.close();
  auto written = test::read_file(dir / "s.bin");
  EXPECT_EQ(0, std::memcmp(written.data(), data.data() + 12345, 4096));
}

// Work queued on the legacy default stream before a request (a fill, as Buffer::fill, CuPy and
// PyTorch queue it) happens before ferry's copies, never on top of them; and a write waits for
// work queued before it that produces its bytes. Three fills of 4 GiB keep the default stream
// busy for milliseconds, and the range used is the last one each fill reaches.
TEST_F(Gpu, CopiesAreOrderedAfterWorkQueuedOnTheDefaultStream) {
  if (test::on_fake_cuda()) {
    GTEST_SKIP() << "the fake runs cuMemsetD8 synchronously: there is no queued fill to order "
                    "after, and its 4 GiB would live in RAM";
  }
  TempDir dir;
  auto data = test::random_bytes(1 << 20, 44);
  test::write_file(dir / "o.bin", data);
  File file(dir / "o.bin");
  const std::size_t size = std::size_t{4} << 30;
  Buffer b(MemoryKind::kDevice, size, 0);
  const std::size_t tail = size - data.size();
  auto fill = [&](int value) {
    for (int i = 0; i < 3; ++i) b.fill(static_cast<unsigned char>(value));  // queued, not waited
  };
  for (int round = 0; round < 10; ++round) {
    fill(round);
    ASSERT_EQ(file.read(static_cast<char*>(b.data()) + tail, data.size(), 0), data.size());
    auto back = copy_back(b, tail, data.size());
    ASSERT_EQ(0, std::memcmp(back.data(), data.data(), data.size())) << "round " << round;
  }
  File out(dir / "w.bin", "w");
  for (int round = 0; round < 10; ++round) {
    fill(0x40 + round);
    ASSERT_EQ(out.write(static_cast<char*>(b.data()) + tail, 1 << 20, 0), std::size_t{1} << 20);
    auto written = test::read_file(dir / "w.bin");
    ASSERT_EQ(written.size(), std::size_t{1} << 20);
    ASSERT_EQ(std::count(written.begin(), written.end(), 0x40 + round), 1 << 20)
        << "round " << round;
  }
}

// CUDA does not survive fork(): a child of a process that initialised it gets a clear error for
// GPU memory, names the reason in its route, and still reads into host memory.
TEST_F(Gpu, ForkedChildSaysWhyCudaIsGoneAndStillReadsHostMemory) {
  if (test::kThreadSanitizer) {
    GTEST_SKIP() << "ThreadSanitizer cannot start threads in the child of a multi-threaded fork()";
  }
  TempDir dir;
  auto data = test::random_bytes(8 << 20, 43);
  test::write_file(dir / "f.bin", data);
  File file(dir / "f.bin");
  Buffer gpu(MemoryKind::kDevice, 8 << 20, 0);
  ASSERT_EQ(file.read(gpu.data(), gpu.size(), 0), gpu.size());  // CUDA and the workers in use
  if (test::kAddressSanitizer) {
    // read() returns when the request completes, and its workers then free what it held (under
    // ASan, still at this line in 24 of 100 runs measured). g++ 12's ASan does not hold its
    // allocator's locks across fork() as glibc's malloc does (LLVM 18 does, llvm-project#75290),
    // so a lock a worker holds here stays held in the child, whose first malloc (in ferry's fork
    // handler) then waits forever. Fork once the workers wait for work.
    const core::ThreadPool& pool = backends::default_runtime().pool();
    for (int i = 0; i < 10000 && !pool.idle(); ++i) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(pool.idle()) << "the read's workers still run 10 s after it returned";
  }
  pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    std::vector<unsigned char> host(8 << 20);
    try {
      if (file.read(host.data(), host.size(), 0) != host.size()) code = 2;
      if (std::memcmp(host.data(), data.data(), host.size()) != 0) code = 3;
      const RouteReport r = file.last_route();
      if (r.to_text().find("fork") == std::string::npos) code = 4;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      code = 5;
    }
    try {
      Buffer again(MemoryKind::kDevice, 4096, 0);
      code = code == 0 ? 6 : code;
    } catch (const CudaError& e) {
      if (std::string(e.what()).find("fork") == std::string::npos) code = code == 0 ? 7 : code;
    }
    _exit(code);
  }
  // Waited for here, not by an alarm in the child: the child may hang in the fork handlers,
  // before its first line. Its stack goes to stderr where gdb can attach.
  int status = 0;
  pid_t ended = 0;
  for (int i = 0; i < 6000 && ended == 0; ++i) {
    ended = waitpid(pid, &status, WNOHANG);
    if (ended == 0) std::this_thread::sleep_for(10ms);
  }
  if (ended == 0) {
    const std::string gdb =
        "gdb -batch -p " + std::to_string(pid) + " -ex 'thread apply all bt' >&2";
    const bool shown = std::system(gdb.c_str()) == 0;
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the child (pid " << pid << ") still runs 60 s after fork(); "
           << (shown ? "its stacks are above" : "gdb could not show its stacks");
  }
  ASSERT_EQ(ended, pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2-3: host read failed, 4: route does not name fork, "
                                       "5: host read threw, 6: CUDA worked, 7: error without fork";
}

// Many small rows into one device buffer (posix_backend.cc shares a staging slot among small
// tasks and copies rows adjacent in the buffer together): rows back to back, rows with gaps
// between them, rows of different sizes, larger ones among them; bytes outside the rows stay.
// A quarter of the rows and of the file under a sanitizer: still five larger ones among them.
TEST_F(Gpu, GatheredRowsIntoOneDeviceBufferMatchTheFile) {
  TempDir dir;
  const std::size_t file_size = (32 << 20) / test::kShrink + 777;
  const auto data = test::pattern_bytes(file_size, 57);
  test::write_file(dir / "rows.bin", data);
  std::mt19937_64 rng(58);
  std::vector<ByteRange> ranges;
  std::size_t at = 0;
  for (int i = 0; i < 20000 / static_cast<int>(test::kShrink); ++i) {
    const std::size_t size = i % 997 == 0 ? (64 << 10) + 1 + rng() % 4096
                             : i % 3 == 0 ? 1 + rng() % 300
                                          : 4096;
    ranges.push_back({rng() % (file_size - size + 1), size, at});
    at += size + (i % 11 == 0 ? 1 + rng() % 64 : 0);  // a gap after some rows
  }
  Buffer gpu(MemoryKind::kDevice, at + 128, 0);
  gpu.fill(0xEE);
  File f(dir / "rows.bin");
  IoFuture fut = f.pread_ranges(gpu.data(), gpu.size(), ranges);
  std::size_t total = 0;
  for (const ByteRange& r : ranges) total += r.size;
  ASSERT_EQ(fut.get(), total);
  const auto back = copy_back(gpu, 0, gpu.size());
  std::vector<unsigned char> expect(gpu.size(), 0xEE);
  for (const ByteRange& r : ranges) {
    std::memcpy(expect.data() + r.buffer_offset, data.data() + r.file_offset, r.size);
  }
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const ByteRange& r = ranges[i];
    ASSERT_EQ(0,
              std::memcmp(back.data() + r.buffer_offset, expect.data() + r.buffer_offset, r.size))
        << "row " << i << " (" << r.size << " B at file offset " << r.file_offset << ")";
  }
  EXPECT_EQ(back, expect);  // the gaps and the tail too
}

}  // namespace
}  // namespace ferry
