// plan, check, explain and read agree on this machine about the path a read takes: each
// prediction is compared with what `ferry read --json` then reports. Nothing here assumes the
// machine: the same test runs where there is no GPU (every read on ferry's POSIX path) and on
// the GPU machine (cuFile where auto mode's rule, src/core/routing.cc, sends it).
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "cli/cli_run.h"
#include "test_util.h"

namespace ferry::test {
namespace {

std::set<std::string> codes(const nlohmann::json& reasons) {
  std::set<std::string> out;
  for (const auto& r : reasons) {
    if (r["code"] != "engine") out.insert(r["code"].get<std::string>());
  }
  return out;
}

class CliAgreement : public ::testing::TestWithParam<std::string> {};

TEST_P(CliAgreement, PlanCheckExplainAndReadSayThePathTheReadTakes) {
  TempDir dir;
  const std::string file = (dir / "agree.bin").string();
  // A 64 MiB file, large enough for gds_threshold and several tasks; then page-cached or not,
  // as the read finds it, since explain and read see the same cache.
  ASSERT_EQ(run_cli("write " + file + " --size 64MiB --host").status, 0);
  const std::string memory = GetParam();

  const nlohmann::json read = run_cli_json("read " + file + memory);
  const nlohmann::json explain = run_cli_json("explain " + file + memory);
  const nlohmann::json plan = run_cli_json("plan --size 64MiB" + memory);
  ASSERT_TRUE(read.contains("route")) << read.dump(2);

  const bool read_posix = read["route"]["layer1"]["cufile_tasks"] == 0;
  EXPECT_EQ(explain["layer1"]["path"], read_posix ? "posix" : "cufile") << explain.dump(2);
  EXPECT_EQ(explain["layer1"]["tasks"], read["route"]["tasks"]);
  EXPECT_EQ(codes(explain["layer1"]["reasons"]), codes(read["route"]["layer1"]["reasons"]))
      << explain["layer1"].dump(2) << "\n"
      << read["route"]["layer1"].dump(2);

  // plan knows no file: a POSIX plan must be the read's path; a cuFile plan leaves the file's
  // own facts (page cache, file system, registration) to decide, and explain names them.
  const std::string planned = plan["path"].get<std::string>();
  EXPECT_EQ(plan["tasks"], read["route"]["tasks"]) << plan.dump(2);
  if (planned != "cufile") {
    EXPECT_TRUE(read_posix) << "plan said " << planned << ", the read went to cuFile";
    EXPECT_EQ(plan["cufile_requests"], 0);
  } else if (read_posix) {
    const std::set<std::string> why = codes(read["route"]["layer1"]["reasons"]);
    EXPECT_TRUE(why.count("page_cache_resident") || why.count("cufile_unavailable") ||
                why.count("cufile_compat_only"))
        << "plan said cuFile; the read's reasons: " << read["route"]["layer1"].dump(2);
  }

  // check's verdict for GPU reads states the same rule, for the default memory.
  if (memory.empty()) {
    CliRun check = run_cli("check --path " + dir.path().string());
    ASSERT_EQ(check.status, 0) << check.out;
    if (planned != "cufile") {
      EXPECT_FALSE(has(check.out, "ferry will send GPU reads of")) << check.out;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Memory, CliAgreement, ::testing::Values("", " --host"),
                         [](const auto& test) {
                           return test.param.empty() ? std::string("DefaultMemory")
                                                     : std::string("HostMemory");
                         });

TEST(CliAgreementHere, WithoutCufileOrNvidiaFsPlanSaysPosixNotCufileRequests) {
  // Where cuFile could only use its compatibility path (no nvidia-fs here, nor on the GPU
  // machine), or there is no GPU at all, auto mode reads through ferry's POSIX path.
  CliRun r = run_cli("plan --size 1GiB");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "plan: 256 task(s) on ferry's POSIX path, cuFile is not called")) << r.out;
  EXPECT_FALSE(has(r.out, "cuFile request(s)")) << r.out;
  CliRun gpu = run_cli("plan --size 1GiB", fake_gpu_env());
  ASSERT_EQ(gpu.status, 0) << gpu.out;
  EXPECT_TRUE(has(gpu.out, "cuFile could only use its POSIX compatibility path")) << gpu.out;
  CliRun check = run_cli("check", fake_gpu_env());
  EXPECT_TRUE(has(check.out, "ferry will read into GPU memory through its own POSIX path"))
      << check.out;
}

}  // namespace
}  // namespace ferry::test
