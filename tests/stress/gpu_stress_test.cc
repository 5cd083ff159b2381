// The stress run (stress.h) into GPU memory (ferry::Buffer of kind kDevice), and into pinned host
// memory. Skips, saying why, without a GPU. Its printed summary is the committed GPU result.
#include <cstdlib>

#include "stress/stress.h"

namespace ferry {
namespace {

class BufferLane final : public test::LaneMemory {
 public:
  BufferLane(MemoryKind kind, std::size_t size) : buffer_(kind, size, 0) {}
  void* data() override { return buffer_.data(); }
  void to_host(void* dst, std::size_t size) override { buffer_.copy_to_host(dst, size); }
  void from_host(const void* src, std::size_t size) override { buffer_.copy_from_host(src, size); }

 private:
  Buffer buffer_;
};

class GpuStress : public ::testing::TestWithParam<MemoryKind> {
 protected:
  void SetUp() override {
    CudaStatus cuda = cuda_status();
    if (!cuda.available || cuda.gpus.empty()) {
      GTEST_SKIP() << "no GPU: " << (cuda.why_not.empty() ? "no device" : cuda.why_not);
    }
  }
};

TEST_P(GpuStress, MixedConcurrentRequestsLoseNoByte) {
  test::TempDir dir;
  test::StressConfig c;
  if (const char* ops = std::getenv("FERRY_STRESS_OPS")) c.ops_per_thread = std::atoi(ops);
  const MemoryKind kind = GetParam();
  test::StressResult r = test::run_stress(
      c, dir.path(), [kind](std::size_t size) { return std::make_unique<BufferLane>(kind, size); });
  test::report(to_string(kind).c_str(), c, r);
  EXPECT_EQ(r.errors, 0u) << r.first_error;
}

INSTANTIATE_TEST_SUITE_P(Kinds, GpuStress,
                         ::testing::Values(MemoryKind::kDevice, MemoryKind::kHostPinned),
                         [](const auto& param_info) {
                           return param_info.param == MemoryKind::kDevice ? "Device" : "Pinned";
                         });

}  // namespace
}  // namespace ferry
