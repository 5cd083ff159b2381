// Remote sources into GPU memory (label gpu; skipped where no GPU is found): an object over HTTP
// lands byte for byte in device memory through the staging copies, after retries too; a
// gathered read lands in many small adjacent allocations (issue 29's shape); a checkpoint loads
// into the GPU equal to its host load; compat_mode=off refuses, since cuFile reads local files
// only.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_driver.h"
#include "ferry/checkpoint.h"
#include "ferry/checkpoint_writer.h"
#include "ferry/error.h"
#include "ferry/file.h"
#include "ferry/memory.h"
#include "ferry/remote.h"
#include "ferry/runtime.h"
#include "ferry/settings.h"
#include "served_folder.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

std::vector<char> random_bytes(std::size_t n, unsigned seed) {
  std::vector<char> v(n);
  std::mt19937 r(seed);
  for (char& c : v) c = static_cast<char>(r());
  return v;
}

std::vector<char> device_bytes(const void* device_pointer, std::size_t n) {
  std::vector<char> out(n);
  if (n == 0) return out;
  cuda::use_device(0);
  cuda::check(cuda::driver().MemcpyDtoH(out.data(),
                                        reinterpret_cast<cuda::abi::DevicePtr>(device_pointer), n),
              "cuMemcpyDtoH");
  return out;
}

class GpuRemote : public test::ServedFolder {
 protected:
  void SetUp() override {
    CudaStatus cuda = cuda_status();
    if (!cuda.available || cuda.gpus.empty()) {
      GTEST_SKIP() << "no GPU: " << (cuda.why_not.empty() ? "no device" : cuda.why_not);
    }
    test::ServedFolder::SetUp();
  }
  std::vector<char> put(const std::string& name, std::size_t size, unsigned seed) {
    std::vector<char> data = random_bytes(size, seed);
    fs::create_directories((root_ / name).parent_path());
    std::ofstream(root_ / name, std::ios::binary).write(data.data(), static_cast<long>(size));
    return data;
  }
};

TEST_F(GpuRemote, AnObjectLandsInDeviceMemoryExactly) {
  const std::size_t size = (std::size_t{37} << 20) + 4093;  // many tasks, an odd tail
  const std::vector<char> data = put("big.bin", size, 1);
  File f(server_->url("big.bin"), "r");
  Buffer gpu(MemoryKind::kDevice, size + 4096, 0);
  IoFuture fut = f.pread(gpu.data(), size, 0);
  ASSERT_EQ(fut.get(), size);
  EXPECT_EQ(device_bytes(gpu.data(), size), data);
  const RouteReport r = fut.route();
  EXPECT_EQ(r.memory, MemoryKind::kDevice);
  ASSERT_FALSE(r.reasons.empty());
  EXPECT_EQ(r.reasons.front().code, ReasonCode::kRemoteSource);
  EXPECT_EQ(r.cufile_tasks, 0u);
  EXPECT_EQ(r.source.bytes, size);
  EXPECT_EQ(r.source.gets, r.tasks);
  // As many connections as into host memory: host_nthreads, not the copy engine's nthreads.
  EXPECT_EQ(r.workers, std::min<std::size_t>(r.tasks, settings().host_nthreads));
  EXPECT_GT(r.workers, settings().nthreads);

  // An unaligned piece at an unaligned device offset.
  Buffer part(MemoryKind::kDevice, 1 << 20, 0);
  const std::size_t n = 300001;
  ASSERT_EQ(f.pread(static_cast<char*>(part.data()) + 13, n, 777).get(), n);
  const std::vector<char> got = device_bytes(static_cast<char*>(part.data()) + 13, n);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin() + 777));
}

TEST_F(GpuRemote, AServerThatIgnoresRangeStreamsIntoDeviceMemoryFromOneGet) {
  // Issue 47: python3 -m http.server answers every GET with the whole object. Into GPU memory
  // each task lands through staging buffers smaller than it, one piece after another: all of
  // them are taken in order from one GET.
  server_->set_ignore_ranges(true);
  server_->set_without_etags(true);
  const std::size_t size = (std::size_t{13} << 20) + 4093;
  const std::vector<char> data = put("plain.bin", size, 5);
  FileOptions small_staging;
  small_staging.settings.bounce_buffer_size = std::size_t{1} << 20;
  File f(server_->url("plain.bin"), "r", small_staging);
  Buffer gpu(MemoryKind::kDevice, size, 0);
  IoFuture fut = f.pread(gpu.data(), size, 0);
  ASSERT_EQ(fut.get(), size);
  EXPECT_EQ(device_bytes(gpu.data(), size), data);
  EXPECT_TRUE(fut.route().source.range_ignored);
  EXPECT_EQ(fut.route().source.gets, 1u);
  EXPECT_EQ(fut.route().workers, 1u);

  const std::size_t offset = (std::size_t{5} << 20) + 3, n = (std::size_t{6} << 20) + 1;
  IoFuture part = f.pread(gpu.data(), n, offset);
  ASSERT_EQ(part.get(), n);
  const std::vector<char> got = device_bytes(gpu.data(), n);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin() + static_cast<long>(offset)));
  EXPECT_EQ(part.route().source.gets, 1u);
  EXPECT_EQ(part.route().source.discarded, offset);
}

TEST_F(GpuRemote, RetriedGetsStillLandExactly) {
  setenv("FERRY_REMOTE_RETRIES", "4", 1);
  const std::size_t size = std::size_t{12} << 20;
  const std::vector<char> data = put("flaky.bin", size, 2);
  File f(server_->url("flaky.bin"), "r");
  Buffer gpu(MemoryKind::kDevice, size, 0);
  server_->fail_next(2, 503);
  IoFuture fut = f.pread(gpu.data(), size, 0);
  ASSERT_EQ(fut.get(), size);
  EXPECT_EQ(device_bytes(gpu.data(), size), data);
  EXPECT_EQ(fut.route().source.retries, 2u);
  // A body cut short: tried again, and no byte of the cut answer lands wrong.
  gpu.fill(0);
  server_->short_body_next(1);
  fut = f.pread(gpu.data(), size, 0);
  ASSERT_EQ(fut.get(), size);
  EXPECT_EQ(device_bytes(gpu.data(), size), data);
  EXPECT_EQ(fut.route().source.retries, 1u);
  unsetenv("FERRY_REMOTE_RETRIES");
}

TEST_F(GpuRemote, GathersIntoManyAdjacentSmallAllocations) {
  // Issue 29's shape: small allocations next to each other in device address space, filled by
  // one gathered request whose ranges are adjacent in the object.
  const std::size_t pieces = 64, piece = 8192;
  const std::vector<char> data = put("small.bin", pieces * piece, 3);
  std::vector<Buffer> buffers;
  std::vector<ReadRange> ranges;
  for (std::size_t i = 0; i < pieces; ++i) {
    buffers.emplace_back(MemoryKind::kDevice, piece, 0);
    ranges.push_back({i * piece, piece, buffers.back().data()});
  }
  File f(server_->url("small.bin"), "r");
  ASSERT_EQ(f.pread_gather(ranges).get(), pieces * piece);
  for (std::size_t i = 0; i < pieces; ++i) {
    const std::vector<char> got = device_bytes(buffers[i].data(), piece);
    ASSERT_TRUE(std::equal(got.begin(), got.end(), data.begin() + i * piece)) << "piece " << i;
  }
}

TEST_F(GpuRemote, CheckpointLoadsIntoTheGpuEqualToTheHostLoad) {
  std::vector<float> w(1 << 18);
  std::vector<std::uint16_t> h(4099);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.25f;
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::uint16_t>(i * 7);
  std::vector<TensorSource> tensors = {{"w", Dtype::kF32, {512, 512}, w.data(), w.size() * 4},
                                       {"h", Dtype::kBF16, {4099}, h.data(), h.size() * 2},
                                       {"e", Dtype::kF32, {0}, nullptr, 0}};
  SaveOptions options;
  options.max_shard_size = 600000;
  save_checkpoint(tensors, root_ / "model", options);
  Checkpoint remote(server_->url("model/"));
  LoadOptions host;
  host.memory = MemoryKind::kHostPageable;
  const LoadResult want = Checkpoint(root_ / "model").load(host);
  for (bool one_allocation : {false, true}) {
    LoadOptions gpu;
    gpu.one_allocation = one_allocation;
    const LoadResult got = remote.load(gpu);
    ASSERT_EQ(got.tensors.size(), want.tensors.size());
    for (std::size_t i = 0; i < got.tensors.size(); ++i) {
      ASSERT_EQ(got.tensors[i].name, want.tensors[i].name);
      ASSERT_EQ(got.tensors[i].nbytes, want.tensors[i].nbytes);
      const std::vector<char> bytes = device_bytes(got.tensors[i].data, got.tensors[i].nbytes);
      EXPECT_EQ(std::memcmp(bytes.data(), want.tensors[i].data, bytes.size()), 0)
          << got.tensors[i].name << (one_allocation ? " (one allocation)" : "");
    }
    EXPECT_TRUE(got.report.routes.front().source.remote);
  }
}

TEST_F(GpuRemote, SmallTensorsSharingGetsLandInTheirPlacesOnTheGpu) {
  // Issue 48: 200 tensors of 4 KiB and one of 4 MiB; the small ones come in one GET into host
  // memory and are copied to their places on the GPU, the big one is read in place.
  std::vector<std::vector<std::uint8_t>> data;
  std::vector<TensorSource> tensors;
  for (std::size_t i = 0; i <= 200; ++i) {
    data.emplace_back(i < 200 ? 4096 : 4 << 20);
    for (std::size_t k = 0; k < data.back().size(); ++k) data.back()[k] = (i * 31 + k * 7) & 0xff;
  }
  for (std::size_t i = 0; i < data.size(); ++i) {
    tensors.push_back({"t" + std::to_string(1000 + i),
                       Dtype::kU8,
                       {data[i].size()},
                       data[i].data(),
                       data[i].size()});
  }
  save_checkpoint(tensors, root_ / "small");
  Checkpoint remote(server_->url("small/"));
  for (MemoryKind kind : {MemoryKind::kDevice, MemoryKind::kHostPinned}) {
    LoadOptions options;
    options.memory = kind;
    const LoadResult got = remote.load(options);
    ASSERT_EQ(got.tensors.size(), data.size());
    for (const LoadedTensor& t : got.tensors) {
      const std::size_t i = std::stoul(t.name.substr(1)) - 1000;
      const std::vector<char> bytes =
          kind == MemoryKind::kDevice ? device_bytes(t.data, t.nbytes)
                                      : std::vector<char>(static_cast<char*>(t.data),
                                                          static_cast<char*>(t.data) + t.nbytes);
      ASSERT_EQ(bytes.size(), data[i].size()) << t.name;
      EXPECT_EQ(std::memcmp(bytes.data(), data[i].data(), bytes.size()), 0) << t.name;
    }
    EXPECT_EQ(got.report.gets, 2u) << got.report.summary();  // one span, the big one in place
    EXPECT_EQ(got.report.routes.size(), 2u);
  }
}

TEST_F(GpuRemote, CompatOffIsRefusedWithTheReason) {
  put("x.bin", 1 << 20, 4);
  FileOptions options;
  options.settings.compat_mode = CompatMode::kOff;
  File f(server_->url("x.bin"), "r", options);
  Buffer gpu(MemoryKind::kDevice, 1 << 20, 0);
  try {
    f.pread(gpu.data(), 1 << 20, 0).get();
    FAIL() << "compat_mode=off read a remote object";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("remote"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ferry
