// Tests that need a fresh process (reliability_probe): malformed settings in the environment,
// settings set directly on a SettingsOverride (bypassing the parsers), and process exit with
// requests still in flight. A probe that hangs is killed and the test fails.
#include <gtest/gtest.h>

#include "reliability/subprocess.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::run_process;
using test::TempDir;

constexpr double kTimeout = 20;  // generous: sanitizer builds start slowly

test::ProcessResult probe(std::vector<std::string> args,
                          std::vector<std::pair<std::string, std::string>> env = {}) {
  args.insert(args.begin(), FERRY_RELIABILITY_PROBE);
  return run_process(args, env, kTimeout);
}

TEST(EnvironmentSettings, EveryMalformedVariableIsASettingErrorNamingIt) {
  const std::pair<const char*, const char*> kBad[] = {
      {"FERRY_TASK_SIZE", "0"},        {"FERRY_TASK_SIZE", "4 MiBs"},
      {"FERRY_TASK_SIZE", "-4M"},      {"FERRY_TASK_SIZE", ""},
      {"FERRY_GDS_THRESHOLD", "1.5K"}, {"FERRY_BOUNCE_BUFFER_SIZE", "99999999999T"},
      {"FERRY_NTHREADS", "0"},         {"FERRY_NTHREADS", "4097"},
      {"FERRY_NTHREADS", "eight"},     {"FERRY_COMPAT_MODE", "maybe"},
      {"FERRY_REQUIRE", "nvme"},       {"FERRY_COMPAT_MODE", "\xff\xfe"},
  };
  for (const auto& [name, value] : kBad) {
    test::ProcessResult r = probe({"settings"}, {{name, value}});
    EXPECT_TRUE(r.exited && r.exit_code == 3) << name << "=" << value << ": " << r.describe();
    EXPECT_NE(r.output.find(name), std::string::npos) << r.output;
  }
}

TEST(EnvironmentSettings, MalformedVariableFailsEveryRequestRatherThanFallingBack) {
  TempDir dir;
  test::write_file(dir / "f.bin", test::random_bytes(1000, 1));
  test::ProcessResult r = probe({"read", (dir / "f.bin").string()}, {{"FERRY_NTHREADS", "lots"}});
  EXPECT_TRUE(r.exited && r.exit_code == 3) << r.describe();
  EXPECT_NE(r.output.find("FERRY_NTHREADS"), std::string::npos) << r.output;
}

TEST(EnvironmentSettings, WellFormedVariablesAreUsed) {
  test::ProcessResult r =
      probe({"settings"}, {{"FERRY_TASK_SIZE", " 1mib "}, {"FERRY_NTHREADS", "3"}});
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.describe();
  EXPECT_NE(r.output.find("task_size=1048576 nthreads=3"), std::string::npos) << r.output;
}

// SettingsOverride's fields are public: code can set values the parsers would refuse. A request
// under such settings must fail with a SettingError, not divide by zero, spin or wait forever.
class OverrideBypass : public ::testing::TestWithParam<std::pair<const char*, bool>> {};

TEST_P(OverrideBypass, ZeroIsASettingErrorNotACrashOrHang) {
  TempDir dir;
  test::write_file(dir / "f.bin", test::random_bytes(300000, 2));
  auto [field, direct] = GetParam();
  std::vector<std::string> args = {"override", field, "0", (dir / "f.bin").string()};
  if (direct) args.push_back("direct");
  test::ProcessResult r = probe(args);
  EXPECT_TRUE(r.exited && r.exit_code == 3) << field << "=0: " << r.describe();
}

INSTANTIATE_TEST_SUITE_P(Fields, OverrideBypass,
                         ::testing::Values(std::make_pair("task_size", false),
                                           std::make_pair("nthreads", false),
                                           std::make_pair("bounce_buffer_size", true)),
                         [](const auto& param_info) {
                           return std::string(param_info.param.first);
                         });

class ExitInFlight : public ::testing::TestWithParam<const char*> {};

TEST_P(ExitInFlight, ProcessExitsPromptlyAndCleanly) {
  TempDir dir;
  // 2 MiB: 16 reads of 512 tasks each are still running at exit in every build, and a TSan
  // build submits them in ~1.5 s (8 MiB took 6 s alone and over kTimeout on a loaded machine).
  test::write_file(dir / "big.bin", test::pattern_bytes(2 << 20, 3));
  test::ProcessResult r = probe({GetParam(), (dir / "big.bin").string()});
  EXPECT_TRUE(r.exited && r.exit_code == 0) << r.describe();
  EXPECT_NE(r.output.find("leaving with reads in flight"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Ways, ExitInFlight,
                         ::testing::Values("exit-return", "exit-call", "exit-static"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           return n.replace(n.find('-'), 1, "_");
                         });

}  // namespace
}  // namespace ferry
