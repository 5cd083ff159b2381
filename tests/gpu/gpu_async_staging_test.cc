// The pinned pool of asynchronous saves (ferry/async_staging.h): copies land, the pool is reused
// (no cuMemHostAlloc on a save of the same tensors), grows only for a bigger save, stays flat
// over 20 saves, follows the caller's stream, and a failed copy names its tensor.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <thread>

#include "cuda/cuda_driver.h"
#include "ferry/async_staging.h"
#include "ferry/ferry.h"
#include "test_util.h"

namespace ferry {
namespace {

namespace abi = cuda::abi;

class AsyncStagingGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    CudaStatus cuda = cuda_status();
    if (!cuda.available || cuda.gpus.empty()) {
      GTEST_SKIP() << "no GPU: " << (cuda.why_not.empty() ? "no device" : cuda.why_not);
    }
  }
};

// cuMemHostAlloc calls so far, as the test double of libcuda counts them; -1 on a real driver
// (then the pool's own count is checked alone).
long long host_allocs() {
  const char* lib = std::getenv("FERRY_CUDA_LIBRARY");
  void* h = dlopen(lib != nullptr ? lib : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  auto* f =
      h != nullptr
          ? reinterpret_cast<unsigned long long (*)()>(dlsym(h, "ferry_fake_cuda_host_allocs"))
          : nullptr;
  return f != nullptr ? static_cast<long long>(f()) : -1;
}

long rss_kib() {
  std::ifstream in("/proc/self/statm");
  long pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// GPU tensors of the given sizes, filled with distinct patterns, and one host tensor.
struct Tensors {
  std::vector<Buffer> device;
  std::vector<std::vector<unsigned char>> want;
  std::vector<unsigned char> host;
  std::vector<StageItem> items;

  Tensors(std::initializer_list<std::size_t> sizes, std::uint64_t seed) {
    for (std::size_t n : sizes) {
      want.push_back(test::pattern_bytes(n, seed++));
      device.emplace_back(MemoryKind::kDevice, n, 0);
      device.back().copy_from_host(want.back().data(), n);
    }
    host = test::pattern_bytes(12345, seed);
    for (std::size_t i = 0; i < device.size(); ++i) {
      items.push_back(
          {"model.layers." + std::to_string(i) + ".w", device[i].data(), want[i].size()});
    }
    items.push_back({"optim.step", host.data(), host.size()});
    items.push_back({"empty", nullptr, 0});
  }

  void expect_landed(const AsyncStaging& s) const {
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(std::memcmp(s.place(i), want[i].data(), want[i].size()), 0) << items[i].name;
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s.place(i)) % 4096, 0u);
    }
    EXPECT_EQ(std::memcmp(s.place(want.size()), host.data(), host.size()), 0);
  }
};

TEST_F(AsyncStagingGpu, CopiesLandInPinnedMemory) {
  Tensors t({(3u << 20) + 7, 4096, 100}, 1);
  AsyncStagingPool pool;
  std::shared_ptr<AsyncStaging> s = pool.stage(t.items);
  s->wait();
  EXPECT_TRUE(s->done());
  t.expect_landed(*s);
  EXPECT_EQ(classify_memory(s->place(0)).kind, MemoryKind::kHostPinned);
  const AsyncStagingReport r = pool.report();
  EXPECT_TRUE(r.pinned);
  EXPECT_EQ(r.last_gpu_bytes, (3u << 20) + 7 + 4096 + 100);
  EXPECT_EQ(r.last_bytes, r.last_gpu_bytes + 12345);
  EXPECT_EQ(r.last_batches, 1u);
}

TEST_F(AsyncStagingGpu, ASecondSaveOfTheSameTensorsAllocatesNothing) {
  Tensors t({1u << 20, 5000, 3}, 10);
  AsyncStagingPool pool;
  pool.stage(t.items)->wait();
  const long long after_first = host_allocs();
  const AsyncStagingReport first = pool.report();
  EXPECT_EQ(first.allocations, 1u);
  EXPECT_EQ(first.growths, 1u);
  t.device[0].copy_from_host(t.want[1].data(), 5000);  // a training step changed the tensor
  std::memcpy(t.want[0].data(), t.want[1].data(), 5000);
  std::shared_ptr<AsyncStaging> s = pool.stage(t.items);
  s->wait();
  t.expect_landed(*s);
  EXPECT_EQ(pool.report().allocations, 1u);
  EXPECT_EQ(pool.report().pinned_bytes, first.pinned_bytes);
  if (after_first >= 0) {
    EXPECT_EQ(host_allocs(), after_first);
  }
}

TEST_F(AsyncStagingGpu, GrowsOnlyForABiggerSave) {
  Tensors small({1u << 20}, 20), big({1u << 20, 2u << 20}, 30);
  AsyncStagingPool pool;
  pool.stage(small.items)->wait();
  const std::uint64_t first = pool.report().pinned_bytes;
  std::shared_ptr<AsyncStaging> s = pool.stage(big.items);
  s->wait();
  big.expect_landed(*s);
  s.reset();
  AsyncStagingReport r = pool.report();
  EXPECT_EQ(r.allocations, 2u);
  EXPECT_EQ(r.growths, 2u);
  EXPECT_GT(r.pinned_bytes, first);
  const long long before = host_allocs();
  pool.stage(small.items)->wait();
  pool.stage(big.items)->wait();
  EXPECT_EQ(pool.report().allocations, 2u);
  if (before >= 0) {
    EXPECT_EQ(host_allocs(), before);
  }
}

TEST_F(AsyncStagingGpu, MemoryStaysFlatOverTwentySaves) {
  Tensors t({8u << 20, 1u << 20, 777}, 40);
  AsyncStagingPool pool;
  pool.stage(t.items)->wait();
  const AsyncStagingReport first = pool.report();
  const long long allocs = host_allocs();
  const long rss = rss_kib();
  for (int i = 0; i < 20; ++i) {
    std::shared_ptr<AsyncStaging> s = pool.stage(t.items);
    s->wait();
    if (i == 19) t.expect_landed(*s);
  }
  const AsyncStagingReport r = pool.report();
  EXPECT_EQ(r.stages, 21u);
  EXPECT_EQ(r.allocations, first.allocations);
  EXPECT_EQ(r.pinned_bytes, first.pinned_bytes);
  EXPECT_EQ(r.chunks, first.chunks);
  if (allocs >= 0) {
    EXPECT_EQ(host_allocs(), allocs);
  }
  EXPECT_LT(rss_kib() - rss, 2048) << "host RSS grew over 20 saves";
}

TEST_F(AsyncStagingGpu, AFailedCopyNamesItsTensorAndThePoolGoesOn) {
  Tensors t({1u << 20}, 50);
  std::vector<StageItem> bad = t.items;
  bad[0].nbytes = (1u << 20) + 4096;  // past the end of its allocation
  AsyncStagingPool pool;
  try {
    pool.stage(bad);
    FAIL() << "a copy past its allocation was staged";
  } catch (const CudaError& e) {
    EXPECT_NE(std::string(e.what()).find("'model.layers.0.w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuMemcpyDtoHAsync"), std::string::npos) << e.what();
  }
  std::shared_ptr<AsyncStaging> s = pool.stage(t.items);
  s->wait();
  t.expect_landed(*s);
}

TEST_F(AsyncStagingGpu, TheNextStageWaitsForThePreviousToBeReleased) {
  Tensors t({4096}, 60);
  AsyncStagingPool pool;
  std::shared_ptr<AsyncStaging> held = pool.stage(t.items);
  held->wait();
  try {
    pool.stage(t.items);
    FAIL() << "a second stage overwrote the tensors of one still held";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("still in use"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pool.close(), Error);
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    held.reset();
  });
  std::shared_ptr<AsyncStaging> next = pool.stage(t.items, {}, std::chrono::seconds(30));
  release.join();
  next->wait();
  t.expect_landed(*next);
  next.reset();
  pool.close();
  EXPECT_EQ(pool.report().pinned_bytes, 0u);
}

// The copies wait for the work queued on the caller's stream before the call: here a wait on
// the legacy default stream for a flag in mapped pinned memory, which the test sets later.
TEST_F(AsyncStagingGpu, CopiesFollowTheCallersStream) {
  const cuda::Driver& d = cuda::driver();
  cuda::use_device(0);
  void* flag_host = nullptr;
  cuda::check(d.MemHostAlloc(&flag_host, 4096, abi::kMemHostAllocDeviceMap), "cuMemHostAlloc");
  auto* flag = static_cast<std::uint32_t*>(flag_host);
  *flag = 0;
  abi::DevicePtr flag_device = 0;
  cuda::check(d.MemHostGetDevicePointer(&flag_device, flag_host, 0), "cuMemHostGetDevicePointer");
  Tensors t({1u << 20}, 70);
  AsyncStagingPool pool;
  cuda::check(d.StreamWaitValue32(nullptr, flag_device, 1, abi::kStreamWaitValueGeq),
              "cuStreamWaitValue32");
  const StageAfter after[] = {{0, 0}};
  std::shared_ptr<AsyncStaging> s = pool.stage(t.items, after);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(s->done()) << "the copies ran before the caller's stream reached them";
  std::atomic_ref<std::uint32_t>(*flag).store(1);
  s->wait();
  t.expect_landed(*s);
  s.reset();
  d.MemFreeHost(flag_host);
}

}  // namespace
}  // namespace ferry
