// ferry read --gpu with several GPUs (0,1 or all): the option's parsing, which needs no GPU; the
// same "no CUDA driver" error as --gpu 0 where there is no driver; and, where GPUs exist, the
// split read landing the same bytes as a host read.
#include <gtest/gtest.h>

#include <filesystem>

#include "cli/cli_run.h"
#include "test_util.h"

namespace ferry::test {
namespace {

constexpr const char* kNoDriver = "FERRY_CUDA_LIBRARY=/nonexistent/libcuda.so.1";

// `ferry check --json` gives the count ("gpus": 2); the size of that number, which this read
// before, is 1 whatever the count (found on the two-GPU test double of libcuda).
int gpu_count() {
  auto j = run_cli_json("check");
  return j["cuda"]["available"] == true ? j["cuda"]["gpus"].get<int>() : 0;
}

TEST(CliReadGpus, MalformedListsAreRefusedBeforeAnyIo) {
  TempDir dir;
  write_file(dir / "f.bin", random_bytes(1 << 16, 81));
  const std::string path = (dir / "f.bin").string();
  for (const char* bad : {"0,0", "x", "0,,1", "-1", "1,", ",", "all,0", "0;1", "99999"}) {
    CliRun r = run_cli("read " + path + " --gpu '" + bad + "'", kNoDriver);
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_TRUE(has(r.out, "--gpu: ")) << bad << ": " << r.out;
    EXPECT_FALSE(has(r.out, "CUDA driver")) << "parsed before CUDA is asked: " << r.out;
  }
  CliRun twice = run_cli("read " + path + " --gpu 1,0,1", kNoDriver);
  EXPECT_TRUE(has(twice.out, "GPU 1 is named twice in '1,0,1'")) << twice.out;
  CliRun both = run_cli("read " + path + " --gpu 0,1 --host", kNoDriver);
  EXPECT_NE(both.status, 0);
  EXPECT_TRUE(has(both.out, "excludes")) << both.out;
}

TEST(CliReadGpus, WithoutADriverSeveralGpusFailLikeOne) {
  TempDir dir;
  write_file(dir / "f.bin", random_bytes(1 << 16, 82));
  const std::string path = (dir / "f.bin").string();
  CliRun one = run_cli("read " + path + " --gpu 0", kNoDriver);
  ASSERT_EQ(one.status, 1) << one.out;
  EXPECT_TRUE(has(one.out, "no CUDA driver: /nonexistent/libcuda.so.1 not found")) << one.out;
  for (const char* gpus : {"0,1", "all", "1,0", "3"}) {
    CliRun r = run_cli("read " + path + " --gpu " + gpus, kNoDriver);
    EXPECT_EQ(r.status, 1) << gpus;
    EXPECT_EQ(r.out, one.out) << gpus;
    CliRun j = run_cli("read " + path + " --gpu " + gpus + " --json", kNoDriver);
    EXPECT_EQ(j.status, 1) << gpus;
    EXPECT_EQ(j.out, one.out) << gpus;
  }
  // A missing file is still said first, as before.
  CliRun missing = run_cli("read " + (dir / "nope.bin").string() + " --gpu 0,1", kNoDriver);
  EXPECT_EQ(missing.status, 1);
  EXPECT_TRUE(has(missing.out, "No such file or directory")) << missing.out;
}

TEST(CliReadGpus, OnThisMachineWithoutAGpu) {
  if (gpu_count() > 0) GTEST_SKIP() << "a CUDA GPU is here (the GPU cases below cover it)";
  TempDir dir;
  write_file(dir / "f.bin", random_bytes(1 << 16, 83));
  CliRun one = run_cli("read " + (dir / "f.bin").string() + " --gpu 0");
  CliRun all = run_cli("read " + (dir / "f.bin").string() + " --gpu all");
  EXPECT_NE(one.status, 0);
  EXPECT_EQ(all.status, one.status);
  EXPECT_EQ(all.out, one.out);
}

TEST(CliReadGpus, SplitReadLandsTheFileOnEveryGpu) {
  const int gpus = gpu_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA GPU here";
  TempDir dir;
  const std::size_t size = (24u << 20) + 12345;  // not a multiple of the parts or of 4 KiB
  write_file(dir / "f.bin", random_bytes(size, 84));
  const std::string path = (dir / "f.bin").string();
  auto host = run_cli_json("read " + path + " --host --checksum");
  auto all = run_cli_json("read " + path + " --gpu all --checksum --repeat 2");
  EXPECT_EQ(all["sha256"], host["sha256"]);
  EXPECT_EQ(all["bytes"], size);
  if (gpus == 1) {
    EXPECT_EQ(all["device"], 0) << "one GPU: the single-GPU output";
    CliRun r = run_cli("read " + path + " --gpu 0,1");
    EXPECT_NE(r.status, 0);
    EXPECT_TRUE(has(r.out, "GPU 1 does not exist: this machine has 1 GPU(s)")) << r.out;
    return;
  }
  ASSERT_EQ(all["parts"].size(), static_cast<std::size_t>(gpus));
  std::uint64_t at = 0;
  for (std::size_t k = 0; k < all["parts"].size(); ++k) {
    const auto& part = all["parts"][k];
    EXPECT_EQ(part["device"], static_cast<int>(k));
    EXPECT_EQ(part["offset"].get<std::uint64_t>(), at);
    at += part["bytes"].get<std::uint64_t>();
    EXPECT_EQ(part["route"]["memory"], "gpu");
    EXPECT_GT(part["gbps"].get<double>(), 0);
  }
  EXPECT_EQ(at, size);
  EXPECT_EQ(all["runs"].size(), 2u);
  auto reversed = run_cli_json("read " + path + " --gpu 1,0 --checksum --offset 4096");
  EXPECT_EQ(reversed["parts"][0]["device"], 1);
  EXPECT_EQ(reversed["bytes"], size - 4096);
  CliRun text = run_cli("read " + path + " --gpu 0,1");
  EXPECT_EQ(text.status, 0) << text.out;
  EXPECT_TRUE(has(text.out, "GB/s in all (GPU 0 ")) << text.out;
  EXPECT_TRUE(has(text.out, "GPU 1: ")) << text.out;
}

}  // namespace
}  // namespace ferry::test
