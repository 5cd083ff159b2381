// The stress run (stress.h) into host memory, buffered and through O_DIRECT. Built and run by the
// sanitizer presets too; FERRY_STRESS_OPS overrides the per-thread request count.
#include "stress/stress.h"

#include <cstdlib>

namespace ferry {
namespace {

class HostLane final : public test::LaneMemory {
 public:
  explicit HostLane(std::size_t size) : bytes_(size) {}
  void* data() override { return bytes_.data(); }
  void to_host(void* dst, std::size_t size) override { std::memcpy(dst, bytes_.data(), size); }
  void from_host(const void* src, std::size_t size) override {
    std::memcpy(bytes_.data(), src, size);
  }

 private:
  std::vector<unsigned char> bytes_;
};

test::StressConfig config() {
  test::StressConfig c;
  if (const char* ops = std::getenv("FERRY_STRESS_OPS")) c.ops_per_thread = std::atoi(ops);
  return c;
}

TEST(Stress, MixedConcurrentRequestsIntoHostMemoryLoseNoByte) {
  test::TempDir dir;
  test::StressConfig c = config();
  test::StressResult r = test::run_stress(
      c, dir.path(), [](std::size_t size) { return std::make_unique<HostLane>(size); });
  test::report("host", c, r);
  EXPECT_EQ(r.errors, 0u) << r.first_error;
  EXPECT_EQ(r.requests, static_cast<std::uint64_t>(c.threads * c.ops_per_thread));
}

TEST(Stress, MixedConcurrentRequestsThroughODirectLoseNoByte) {
  test::TempDir dir;
  test::StressConfig c = config();
  c.direct = true;
  c.ops_per_thread /= 2;
  test::StressResult r = test::run_stress(
      c, dir.path(), [](std::size_t size) { return std::make_unique<HostLane>(size); });
  test::report("host O_DIRECT", c, r);
  EXPECT_EQ(r.errors, 0u) << r.first_error;
}

}  // namespace
}  // namespace ferry
