// The article's table on real hardware: the real libcufile, real GPU memory, a 1 GiB file
// (label gpu). Each case checks the data byte for byte against the file's known content. Run
// through CTest, which gives every test its own process: cuFile's driver opens once per process,
// in the mode of the first request that needs it.
//
// Needs: a CUDA driver and GPU, libcufile.so.0, a file system that takes O_DIRECT under
// FERRY_GPU_TEST_DIR (default: the working directory), and on VMs without udev (the GPU
// machine) the udev entry of docs/data-paths.md, without which cuFileHandleRegister fails with
// 5027. The two "WithoutUdevEntry" cases run only where that entry is absent.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "ferry/cufile.h"
#include "ferry/error.h"
#include "ferry/file.h"
#include "ferry/memory.h"
#include "ferry/settings.h"
#include "test_util.h"

namespace ferry {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

std::uint64_t word(std::uint64_t i) {  // splitmix64: the file's content, word by word
  std::uint64_t z = i + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

const std::vector<std::uint64_t>& reference() {
  static const std::vector<std::uint64_t> ref = [] {
    std::vector<std::uint64_t> r(kGiB / 8);
    for (std::size_t i = 0; i < r.size(); ++i) r[i] = word(i);
    return r;
  }();
  return ref;
}

std::filesystem::path data_file() {
  const char* dir = std::getenv("FERRY_GPU_TEST_DIR");
  std::filesystem::path path =
      std::filesystem::path(dir ? dir : std::filesystem::current_path().string()) /
      "ferry_gpu_test_1GiB.bin";
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) == kGiB) return path;  // made by an earlier test
  // One temporary name per process: CTest runs these tests in parallel processes, and two
  // writers of one ".part" file made the second rename fail (seen on the GPU machine under -j4).
  // Each writes the same bytes, so whichever rename lands last is right.
  std::filesystem::path tmp = path;
  tmp += ".part." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot create " + tmp.string());
  const auto& ref = reference();
  std::fwrite(ref.data(), 1, kGiB, f);
  std::fclose(f);
  std::filesystem::rename(tmp, path);
  return path;
}

// Where cuFile looks for the disk's udev entry.
std::filesystem::path udev_entry(const std::filesystem::path& file) {
  struct stat st {};
  ::stat(file.c_str(), &st);
  return std::filesystem::path("/run/udev/data") /
         ("b" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev)));
}

class GpuCufile : public ::testing::Test {
 protected:
  void SetUp() override {
    CudaStatus cuda = cuda_status();
    if (!cuda.available || cuda.gpus.empty()) GTEST_SKIP() << "no GPU: " << cuda.why_not;
    CufileStatus cf = cufile_status(false);
    if (!cf.loaded) GTEST_SKIP() << "no usable libcufile: " << cf.load_error;
    path_ = data_file();
  }

  // compat_mode=off by default: this machine's cuFile has only its compatibility path, which
  // auto mode leaves for ferry's POSIX path (issue 9); these cases measure cuFile itself.
  SettingsOverride with(std::size_t task_size, CompatMode compat = CompatMode::kOff) {
    SettingsOverride o;
    o.task_size = task_size;
    o.compat_mode = compat;
    return o;
  }

  // Reads [offset, offset+size) into GPU memory and checks it against the reference.
  RouteReport read_and_check(const SettingsOverride& s, std::size_t size, std::uint64_t offset = 0,
                             bool register_it = false) {
    Buffer gpu(MemoryKind::kDevice, size);
    gpu.fill(0);
    RegisteredBuffer reg;
    if (register_it) reg = register_buffer(gpu.data(), size);
    File file(path_, "r", {false, s});
    EXPECT_EQ(file.read(gpu.data(), size, offset), size);
    std::vector<unsigned char> host(size);
    gpu.copy_to_host(host.data(), size);
    const auto* ref = reinterpret_cast<const unsigned char*>(reference().data()) + offset;
    EXPECT_EQ(std::memcmp(host.data(), ref, size), 0) << "GPU data differs from the file";
    RouteReport r = file.last_route();
    std::printf("%s", r.to_text().c_str());
    return r;
  }

  std::filesystem::path path_;
};

// Issue 9: the default on a machine whose cuFile has only its compatibility path is ferry's
// POSIX path, decided without opening cuFile's driver.
TEST_F(GpuCufile, AutoTakesPosixWhereCufileHasOnlyItsCompatibilityPath) {
  RouteReport r = read_and_check(with(4 * kMiB, CompatMode::kAuto), kGiB);
  EXPECT_EQ(r.cufile_tasks, 0u) << r.to_text();
  EXPECT_EQ(r.posix_tasks, 256u);
  EXPECT_EQ(r.reasons.at(0).code, ReasonCode::kCufileCompatOnly) << r.to_text();
  EXPECT_NE(r.reasons.at(0).text.find("nvidia-fs"), std::string::npos) << r.reasons.at(0).text;
  EXPECT_TRUE(r.page_cache.known) << r.page_cache.why_not;
  EXPECT_FALSE(cufile_status(false).driver_open_attempted);
}

TEST_F(GpuCufile, CompatOffSends256RequestsThatCufileServesThroughPosix) {
  RouteReport r = read_and_check(with(4 * kMiB), kGiB);
  ASSERT_EQ(r.cufile_tasks, 256u) << r.to_text() << "(a 5027 reason: create the udev entry)";
  EXPECT_EQ(r.posix_tasks, 0u);
  ASSERT_TRUE(r.cufile.observable) << r.cufile.why_not;
  EXPECT_FALSE(r.cufile.shared_window);
  // cuDeviceGetUuid's bytes name cuFile's per-GPU entry of this GPU (issue 11).
  EXPECT_EQ(r.cufile.gpu_entry, 0) << r.cufile.counted_over;
  EXPECT_EQ(r.cufile.posix, 256u);
  EXPECT_EQ(r.cufile.nvfs, 0u);
  EXPECT_EQ(r.cufile.p2p, 0u);
  EXPECT_EQ(r.verdict(),
            "256 request(s) went to cuFile; cuFile served all 256 piece(s) through its POSIX "
            "compatibility path: the nvidia-fs module is not loaded");
}

TEST_F(GpuCufile, CompatOnNeverCallsCufile) {
  RouteReport r = read_and_check(with(4 * kMiB, CompatMode::kOn), kGiB);
  EXPECT_EQ(r.cufile_tasks, 0u);
  EXPECT_EQ(r.posix_tasks, 256u);
  EXPECT_EQ(r.reasons.at(0).code, ReasonCode::kCompatModeOn);
  EXPECT_FALSE(cufile_status(false).driver_open_attempted);
}

// CUFILE_FORCE_COMPAT_MODE is set before libcufile is even loaded, whenever cuFile reads it.
class GpuCufileForcedCompat : public GpuCufile {
 protected:
  void SetUp() override {
    setenv("CUFILE_FORCE_COMPAT_MODE", "true", 1);
    GpuCufile::SetUp();
  }
};

TEST_F(GpuCufileForcedCompat, CompatOffCountsAllUnderPosix) {
  if (cufile_status(false).driver_open_attempted) GTEST_SKIP() << "needs its own process (ctest)";
  RouteReport r = read_and_check(with(4 * kMiB, CompatMode::kOff), kGiB);
  EXPECT_EQ(r.cufile_tasks, 256u);
  EXPECT_EQ(r.cufile.posix, 256u);
  EXPECT_EQ(r.cufile.nvfs, 0u);
  EXPECT_EQ(r.cufile.compat_why, "CUFILE_FORCE_COMPAT_MODE=true forces it");
}

TEST_F(GpuCufile, OneGiBTaskIsOneRequestCutIntoFourPieces) {
  RouteReport r = read_and_check(with(kGiB), kGiB);
  EXPECT_EQ(r.cufile_tasks, 1u);
  EXPECT_EQ(r.cufile.posix + r.cufile.nvfs, 4u);
}

TEST_F(GpuCufile, SixteenMiBReadIsCutIntoTwoPieces) {
  RouteReport r = read_and_check(with(4 * kMiB), 16 * kMiB, 64 * kMiB);
  // 16 MiB at 4 MiB tasks would be 4 requests; ask for one request of 16 MiB.
  RouteReport one = read_and_check(with(16 * kMiB), 16 * kMiB, 64 * kMiB);
  EXPECT_EQ(r.cufile_tasks, 4u);
  EXPECT_EQ(one.cufile_tasks, 1u);
  EXPECT_EQ(one.cufile.posix + one.cufile.nvfs, 2u);
}

TEST_F(GpuCufile, EightKiBReadGoesToPosixBelowTheThreshold) {
  RouteReport r = read_and_check(with(4 * kMiB, CompatMode::kAuto), 8192, 12288);
  EXPECT_EQ(r.cufile_tasks, 0u);
  EXPECT_EQ(r.reasons.at(0).code, ReasonCode::kBelowThreshold);
  EXPECT_FALSE(cufile_status(false).driver_open_attempted) << "cuFile must not even be opened";
}

// A gathered read through cuFile: each range names its own allocation (cuFile's devPtr_base
// must be the allocation, or the registered base, not the lowest address of the request).
TEST_F(GpuCufile, GatherIntoSeparateAllocationsThroughCufile) {
  for (bool register_one : {false, true}) {
    std::vector<Buffer> buffers;
    std::vector<RegisteredBuffer> registered;
    std::vector<ReadRange> ranges;
    const std::size_t sizes[] = {3 * kMiB + 4096, 8 * kMiB, 4096, 17 * kMiB};
    std::uint64_t offset = 12288;
    for (std::size_t size : sizes) {
      buffers.emplace_back(MemoryKind::kDevice, size + 8192);
      buffers.back().fill(0);
      if (register_one && registered.empty()) {
        registered.push_back(register_buffer(buffers.back().data(), size + 8192));
      }
      ranges.push_back({offset, size, static_cast<char*>(buffers.back().data()) + 4096});
      offset += size + 3 * kMiB;
    }
    File file(path_, "r", {false, with(4 * kMiB)});
    IoFuture fut = file.pread_gather(ranges);
    std::uint64_t total = 0;
    for (std::size_t size : sizes) total += size;
    ASSERT_EQ(fut.get(), total);
    RouteReport r = fut.route();
    EXPECT_GT(r.cufile_tasks, 0u) << r.to_text();
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      std::vector<unsigned char> host(ranges[i].size);
      buffers[i].copy_to_host(host.data(), host.size(), 4096);
      const auto* ref =
          reinterpret_cast<const unsigned char*>(reference().data()) + ranges[i].file_offset;
      EXPECT_EQ(std::memcmp(host.data(), ref, host.size()), 0)
          << "range " << i << (register_one ? " (first buffer registered)" : "");
    }
  }
}

TEST_F(GpuCufile, RegisteredBufferGivesTheSameCounts) {
  RouteReport r = read_and_check(with(4 * kMiB), kGiB, 0, true);
  EXPECT_EQ(r.cufile_tasks, 256u);
  EXPECT_EQ(r.cufile.posix + r.cufile.nvfs, 256u);
}

TEST_F(GpuCufile, RequireGdsFailsBeforeIoNamingTheMissingModule) {
  if (std::filesystem::exists("/proc/driver/nvidia-fs")) GTEST_SKIP() << "nvidia-fs is loaded";
  if (cufile_status(false).driver_open_attempted) GTEST_SKIP() << "needs its own process (ctest)";
  SettingsOverride s = with(4 * kMiB, CompatMode::kAuto);
  s.require = Require::kGds;
  Buffer gpu(MemoryKind::kDevice, 16 * kMiB);
  gpu.fill(0xab);
  File file(path_, "r", {false, s});
  try {
    file.read(gpu.data(), 16 * kMiB);
    FAIL() << "expected RouteError";
  } catch (const RouteError& e) {
    std::printf("%s\n", e.what());
    EXPECT_NE(std::string(e.what()).find("error 5001"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nvidia-fs kernel module is not loaded"),
              std::string::npos);
  }
  std::vector<unsigned char> host(16 * kMiB);
  gpu.copy_to_host(host.data(), host.size());
  EXPECT_EQ(host, std::vector<unsigned char>(16 * kMiB, 0xab)) << "no byte may have moved";
}

TEST_F(GpuCufile, WithoutUdevEntryAutoTakesPosixWithoutRegistering) {
  if (std::filesystem::exists(udev_entry(path_))) {
    GTEST_SKIP() << udev_entry(path_) << " exists; this case needs it absent";
  }
  RouteReport r = read_and_check(with(4 * kMiB, CompatMode::kAuto), 64 * kMiB);
  EXPECT_EQ(r.cufile_tasks, 0u);
  EXPECT_EQ(r.reasons.at(0).code, ReasonCode::kCufileCompatOnly) << r.to_text();
  EXPECT_FALSE(cufile_status(false).driver_open_attempted);
}

TEST_F(GpuCufile, WithoutUdevEntryCompatOffIsAClearError) {
  if (std::filesystem::exists(udev_entry(path_))) {
    GTEST_SKIP() << udev_entry(path_) << " exists; this case needs it absent";
  }
  Buffer gpu(MemoryKind::kDevice, 64 * kMiB);
  File file(path_, "r", {false, with(4 * kMiB, CompatMode::kOff)});
  try {
    file.read(gpu.data(), 64 * kMiB);
    FAIL() << "expected RouteError";
  } catch (const RouteError& e) {
    std::printf("%s\n", e.what());
    EXPECT_NE(std::string(e.what()).find("error 5027"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ferry
