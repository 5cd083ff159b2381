// Every error of the ferry CLI is one line, "ferry: ...", with the documented exit status
// (docs/cli.md: 0 done, 1 the work failed, 2 the command line or a setting was refused), and
// says what would be right: the nearest command or option, the accepted range in words.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <string>

#include "cli/cli_run.h"
#include "test_util.h"

namespace ferry::test {
namespace {

constexpr int kUsage = 2;

// One line on stderr, nothing on stdout.
void expect_one_line(const CliRun& r, const std::string& args) {
  EXPECT_EQ(r.out.rfind("ferry: ", 0), 0u) << args << "\n" << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << "\n" << r.out;
}

// The longest run of digits: a bound such as DBL_MAX printed in full has hundreds.
std::size_t longest_number(const std::string& text) {
  std::size_t longest = 0, run = 0;
  for (char c : text) {
    run = std::isdigit(static_cast<unsigned char>(c)) ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  return longest;
}

TEST(CliErrors, AMisspeltCommandIsNamedWithTheNearestOne) {
  CliRun r = run_cli("raed x.bin");
  EXPECT_EQ(r.status, kUsage);
  EXPECT_EQ(r.out, "ferry: unknown command 'raed': did you mean 'read'?\n");
  r = run_cli("frobnicate");
  EXPECT_EQ(r.status, kUsage);
  expect_one_line(r, "frobnicate");
  EXPECT_TRUE(has(r.out, "unknown command 'frobnicate'; the commands are read, write")) << r.out;
}

TEST(CliErrors, AMisspeltOptionIsNamedWithTheNearestOne) {
  TempDir dir;
  write_file(dir / "f.bin", {1, 2, 3});
  CliRun r = run_cli("read " + (dir / "f.bin").string() + " --thraeds 3");
  EXPECT_EQ(r.status, kUsage);
  EXPECT_EQ(r.out,
            "ferry: unknown option '--thraeds' for 'ferry read': did you mean '--threads'?\n");
  r = run_cli("plan --szie 1GiB");
  EXPECT_EQ(r.status, kUsage);
  EXPECT_TRUE(has(r.out, "did you mean '--size'?")) << r.out;
}

TEST(CliErrors, ParserErrorsAreOneLineWithoutRunWithHelp) {
  for (const std::string args : {"", "plan", "read", "read a b c", "explain x --host --gpu 0",
                                 "stats --json --prometheus"}) {
    CliRun r = run_cli(args);
    EXPECT_EQ(r.status, kUsage) << args << "\n" << r.out;
    expect_one_line(r, args);
    EXPECT_FALSE(has(r.out, "Run with --help")) << r.out;
  }
  EXPECT_TRUE(has(run_cli("").out, "ferry: no command given")) << run_cli("").out;
  EXPECT_TRUE(has(run_cli("plan").out, "ferry: plan: --size is required")) << run_cli("plan").out;
}

TEST(CliErrors, RangeErrorsSayTheRangeInWords) {
  for (const std::string value : {"0", "-1", "abc", "2147483648"}) {
    CliRun r = run_cli("stats -p " + value);
    EXPECT_EQ(r.status, kUsage) << value << "\n" << r.out;
    expect_one_line(r, value);
    EXPECT_TRUE(has(r.out, "must be a process id from 1 to 4194304")) << r.out;
  }
  for (const std::string args : {"stats --watch 0", "stats --watch -1", "bench -T 0", "bench -T -1",
                                 "bench -T inf", "bench -T nan", "bench -T abc"}) {
    CliRun r = run_cli(args);
    EXPECT_EQ(r.status, kUsage) << args << "\n" << r.out;
    expect_one_line(r, args);
    EXPECT_TRUE(has(r.out, "must be a number of seconds above 0")) << args << "\n" << r.out;
    EXPECT_LT(longest_number(r.out), 10u) << args << "\n" << r.out;
  }
}

TEST(CliErrors, ExitStatusSaysWhichKindOfError) {
  TempDir dir;
  write_file(dir / "f.bin", {1, 2, 3});
  const std::string f = (dir / "f.bin").string();
  EXPECT_EQ(run_cli("read " + f + " --host").status, 0);
  // The work failed: the file is missing.
  EXPECT_EQ(run_cli("read " + dir.path().string() + "/missing.bin --host").status, 1);
  // Refused before any work: a malformed flag value or FERRY_* variable.
  EXPECT_EQ(run_cli("read " + f + " --host --task-size 12XB").status, kUsage);
  EXPECT_EQ(run_cli("read " + f + " --host", "FERRY_TASK_SIZE=12XB").status, kUsage);
}

TEST(CliErrors, UsageLinesSayFerryNotTheBinarysPath) {
  CliRun r = run_cli("read --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(has(r.out, "Usage: ferry read")) << r.out;
  EXPECT_FALSE(has(r.out, FERRY_CLI_PATH)) << r.out;
  EXPECT_TRUE(has(run_cli("--help").out, "Exit status: 0 done; 1 the work failed"));
}

TEST(CliErrors, AMisspeltFerryVariableIsSaidOnceWithTheNearestSetting) {
  TempDir dir;
  write_file(dir / "f.bin", {1, 2, 3});
  CliRun r = run_cli("read " + (dir / "f.bin").string() + " --host",
                     "FERRY_THREADS=4 FERRY_FAKE_SOMETHING_ELSE=1");
  EXPECT_EQ(r.status, 0) << r.out;
  const std::string warning =
      "ferry: warning: FERRY_THREADS is not a ferry setting and is ignored; did you mean "
      "FERRY_NTHREADS?\n";
  ASSERT_TRUE(has(r.out, warning)) << r.out;
  EXPECT_EQ(r.out.find(warning), r.out.rfind(warning)) << "said more than once:\n" << r.out;
  EXPECT_FALSE(has(r.out, "FERRY_FAKE_SOMETHING_ELSE")) << r.out;
}

TEST(CliErrors, CheckReportsABadVariableAndGoesOn) {
  CliRun r = run_cli("check", "FERRY_TASK_SIZE=abc");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(has(r.out, "verdict:")) << r.out;
  EXPECT_TRUE(has(r.out, "FERRY_TASK_SIZE='abc'")) << r.out;
  EXPECT_TRUE(has(r.out, "ferry task_size")) << r.out;
}

TEST(CliErrors, TheCommandLinesValueReplacesABadVariable) {
  TempDir dir;
  write_file(dir / "f.bin", std::vector<unsigned char>(8192, 7));
  CliRun r = run_cli("read " + (dir / "f.bin").string() + " --host --task-size 4KiB",
                     "FERRY_TASK_SIZE=abc");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "read 8192 B")) << r.out;
}

TEST(CliBenchFlags, ThreadsMeansFerrysWorkersAsInReadAndJobsTheIssuingThreads) {
  CliRun r = run_cli("bench --threads 1,2 -T 1");
  EXPECT_EQ(r.status, kUsage) << r.out;
  expect_one_line(r, "--threads 1,2");
  EXPECT_TRUE(has(r.out, "-w/--jobs")) << r.out;
  r = run_cli("bench --help");
  EXPECT_TRUE(has(r.out, "-w,--jobs")) << r.out;
  EXPECT_TRUE(has(r.out, "-i,--io-size")) << r.out;
  EXPECT_FALSE(has(r.out, "--workers")) << r.out;
}

TEST(CliBenchFlags, TheFormerNamesStillWorkWithAWarning) {
  TempDir dir;
  CliRun r = run_cli(
      "bench -I read --size 4KiB --workers 1 --total 64KiB -s 64KiB --memory host "
      "-D " +
      dir.path().string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(has(r.out, "ferry: warning: bench --size is now --io-size (-i)")) << r.out;
  EXPECT_TRUE(has(r.out, "ferry: warning: bench --workers is now --threads")) << r.out;
}

}  // namespace
}  // namespace ferry::test
