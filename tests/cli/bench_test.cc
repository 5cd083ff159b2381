// ferry bench, run as a user runs it, on host memory and small files: its JSON lines parsed and
// checked, its gdsio modes, cold runs and the pages the kernel keeps, and its refusals.
#include <gtest/gtest.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/cli_run.h"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;

// A folder of its own for each test, removed at the end.
class CliBench : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ferry-bench-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `ferry bench ARGS --json -D dir` and parses its lines.
  std::vector<nlohmann::json> bench(const std::string& args, int expect_status = 0) {
    CliRun r = run_cli("bench " + args + " --json -D " + dir_.string(), "", false);
    EXPECT_EQ(r.status, expect_status) << args << "\n" << r.out;
    std::vector<nlohmann::json> lines;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << "not a JSON line: " << line;
      if (!j.is_discarded()) lines.push_back(j);
    }
    return lines;
  }

  fs::path dir_;
};

void expect_sane(const nlohmann::json& j) {
  SCOPED_TRACE(j.dump());
  EXPECT_GT(j["gbps"].get<double>(), 0);
  EXPECT_GT(j["iops"].get<double>(), 0);
  EXPECT_GT(j["seconds"].get<double>(), 0);
  EXPECT_NEAR(j["gbps"].get<double>(), j["bytes"].get<double>() / j["seconds"].get<double>() / 1e9,
              1e-6 * j["gbps"].get<double>());
  EXPECT_NEAR(j["iops"].get<double>(), j["requests"].get<double>() / j["seconds"].get<double>(),
              1e-6 * j["iops"].get<double>());
  const auto& lat = j["latency_us"];
  EXPECT_GT(lat["p50"].get<double>(), 0);
  EXPECT_LE(lat["p50"].get<double>(), lat["p99"].get<double>());
  EXPECT_LE(lat["p99"].get<double>(), lat["p99_9"].get<double>());
  EXPECT_LE(lat["p99_9"].get<double>(), lat["max"].get<double>());
  EXPECT_GE(j["cpu_seconds_per_gib"].get<double>(), 0);
}

TEST_F(CliBench, SweepGivesOneLinePerCaseWithBaselineAndCeiling) {
  auto lines = bench(
      "-s 8MiB -i 4KiB,1MiB -w 1,2 --memory host -I randread --total 4MiB --compare --ceiling");
  ASSERT_EQ(lines.size(), 12u) << "2 sizes x 2 thread counts x (ferry, baseline, ceiling)";
  int ferry = 0, baseline = 0, ceiling = 0;
  double last_baseline = 0;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& j = lines[i];
    expect_sane(j);
    EXPECT_EQ(j["mode"], "randread");
    EXPECT_EQ(j["memory"], "host");
    const std::uint64_t io = j["io_size"];
    EXPECT_TRUE(io == 4096 || io == (1u << 20)) << io;
    EXPECT_EQ(j["requests"].get<std::uint64_t>(), (4u << 20) / io) << "--total in requests";
    EXPECT_EQ(j["bytes"].get<std::uint64_t>(), 4u << 20);
    const std::string c = j["case"];
    if (c == "ferry") {
      ++ferry;
      EXPECT_EQ(j["route"], "auto");
      EXPECT_TRUE(has(j["verdict"], "POSIX path")) << j["verdict"];
      EXPECT_EQ(j["cold"], false);
      EXPECT_DOUBLE_EQ(j["page_cache_before"]["resident_fraction"].get<double>(), 1.0)
          << "warm: the file is read once first";
      ASSERT_TRUE(j.contains("ratio"));
      // The baseline of the same case follows it.
      ASSERT_LT(i + 1, lines.size());
      const auto& b = lines[i + 1];
      EXPECT_EQ(b["case"], "baseline");
      EXPECT_EQ(b["io_size"], j["io_size"]);
      EXPECT_EQ(b["threads"], j["threads"]);
      last_baseline = b["gbps"];
      EXPECT_NEAR(j["ratio"].get<double>(), j["gbps"].get<double>() / last_baseline, 1e-9);
    } else if (c == "baseline") {
      ++baseline;
      EXPECT_EQ(j["route"], "pread");
      EXPECT_EQ(j["depth"], 1);
    } else {
      ++ceiling;
      EXPECT_EQ(c, "ceiling");
      EXPECT_EQ(j["route"], "memcpy");
    }
  }
  EXPECT_EQ(ferry, 4);
  EXPECT_EQ(baseline, 4);
  EXPECT_EQ(ceiling, 4);
  EXPECT_TRUE(fs::is_empty(dir_)) << "the temporary file is removed";
}

TEST_F(CliBench, GdsioModesAndTransferTypes) {
  const std::pair<const char*, const char*> modes[] = {
      {"0", "read"}, {"1", "write"}, {"2", "randread"}, {"3", "randwrite"}};
  for (const auto& [number, name] : modes) {
    auto lines = bench(std::string("-x 1 -I ") + number + " -s 4MiB -i 256KiB -w 2 --depth 2");
    ASSERT_EQ(lines.size(), 1u) << name;
    expect_sane(lines[0]);
    EXPECT_EQ(lines[0]["mode"], name);
    EXPECT_EQ(lines[0]["memory"], "host") << "-x 1 is CPU_ONLY";
    EXPECT_EQ(lines[0]["route"], "posix");
    EXPECT_EQ(lines[0]["depth"], 2);
    EXPECT_EQ(lines[0]["bytes"].get<std::uint64_t>(), 4u << 20) << "default total: the file";
    EXPECT_TRUE(has(lines[0]["verdict"], "compat_mode=on")) << lines[0]["verdict"];
    EXPECT_EQ(lines[0].contains("cold"), std::string(name).find("write") == std::string::npos);
  }
  for (int x : {4, 5, 6, 7}) {
    CliRun r = run_cli("bench -x " + std::to_string(x) + " -s 1MiB -D " + dir_.string());
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_TRUE(has(r.out, "no ferry equivalent")) << r.out;
  }
  CliRun r = run_cli("bench -x 1 --memory host");
  EXPECT_NE(r.status, 0) << "-x chooses the memory and the route";
  EXPECT_TRUE(has(r.out, "excludes")) << r.out;
}

// A write case and its baseline each start from the file's pages cached and clean: the one that
// ran second used to write over pages the first had dirtied, which costs less.
TEST_F(CliBench, WriteCasesStartFromCleanPages) {
  auto lines = bench("-I write --memory host -s 8MiB -i 1MiB --compare");
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& j : lines) {
    SCOPED_TRACE(j.dump());
    expect_sane(j);
    EXPECT_EQ(j["page_cache_before"]["dirty"], false);
    EXPECT_GT(j["page_cache_before"]["resident_fraction"].get<double>(), 0.0);
  }
  EXPECT_EQ(lines[0]["case"], "ferry");
  EXPECT_EQ(lines[1]["case"], "baseline");
}

TEST_F(CliBench, GpuMemoryWithoutADriverFailsAsReadDoes) {
  CliRun read = run_cli("read --gpu 0 " + std::string(FERRY_CLI_PATH));
  if (read.status == 0) GTEST_SKIP() << "a GPU is usable here: nothing to refuse";
  // read's message with bench's name and bench's way to host memory: "ferry: read: no CUDA
  // driver: ...; to read into host memory, pass --host".
  const std::string cause = read.out.substr(0, read.out.find(';')).substr(read.out.find(": ", 7));
  for (const char* args :
       {"--memory gpu:0", "-x 0", "-x 2", "--memory host,gpu:0", "--gpu 0", "-d 0"}) {
    CliRun r = run_cli(std::string("bench -s 1MiB -D ") + dir_.string() + " " + args);
    EXPECT_EQ(r.status, read.status) << args;
    EXPECT_EQ(r.out,
              "ferry: bench" + cause + "; to measure host memory, pass --memory host (or -x 1)\n")
        << args;
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "refused before the file is made";
}

TEST_F(CliBench, TimedRunRunsForTheTime) {
  auto lines = bench("-s 4MiB -i 64KiB --memory host -T 0.3");
  ASSERT_EQ(lines.size(), 1u);
  expect_sane(lines[0]);
  EXPECT_GE(lines[0]["seconds"].get<double>(), 0.29);
  EXPECT_LT(lines[0]["seconds"].get<double>(), 5.0);
  EXPECT_GT(lines[0]["requests"].get<std::uint64_t>(), 64u) << "wraps around the 4 MiB file";
}

// What DONTNEED left is measured and said: on a disk the pages go (unless something else maps
// them), on tmpfs they all stay and the run says it was not cold.
TEST_F(CliBench, ColdRunSaysWhatTheKernelKept) {
  auto lines = bench("-s 8MiB -i 1MiB --memory host --cold --compare");
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& j : lines) {
    expect_sane(j);
    const double kept = j["page_cache_before"]["resident_fraction"];
    EXPECT_GE(kept, 0.0);
    EXPECT_LE(kept, 1.0);
    EXPECT_EQ(j["cold"].get<bool>(), kept <= 0.01) << j.dump();
    EXPECT_EQ(j.contains("cold_note"), kept > 0.01) << j.dump();
  }
  // The first timed request's own report, after the drop (not the warm-up's, before it).
  const auto& first = lines[0]["first_request_page_cache"];
  ASSERT_TRUE(first["known"].get<bool>()) << first.dump();
  if (lines[0]["cold"].get<bool>()) {
    EXPECT_LT(first["resident"], first["bytes"]) << first.dump();
  }

  struct statfs shm {};
  if (::statfs("/dev/shm", &shm) != 0 || shm.f_type != 0x01021994 /* TMPFS_MAGIC */) {
    GTEST_SKIP() << "/dev/shm is not tmpfs here";
  }
  CliRun r = run_cli("bench -s 4MiB -i 1MiB --memory host --cold -D /dev/shm --json", "", false);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(j["page_cache_before"]["resident_fraction"].get<double>(), 1.0);
  EXPECT_EQ(j["cold"], false);
  EXPECT_TRUE(has(j["cold_note"], "kept 100%")) << j.dump();
  CliRun table = run_cli("bench -s 4MiB -i 1MiB --memory host --cold -D /dev/shm");
  EXPECT_TRUE(has(table.out, "note: the kernel kept 100% of the file's pages")) << table.out;
}

TEST_F(CliBench, TableOnATerminalWithTheRoute) {
  CliRun r = run_cli("bench -s 4MiB -i 1MiB,2MiB --memory host --compare -D " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* column : {"GB/s", "IOPS", "p50 us", "p99 us", "p99.9 us", "CPU-s/GiB", "ratio"})
    EXPECT_TRUE(has(r.out, column)) << column << "\n" << r.out;
  EXPECT_TRUE(has(r.out, "  route: ")) << r.out;
  EXPECT_TRUE(has(r.out, "warm page cache")) << r.out;
  EXPECT_TRUE(has(r.out, " pread ")) << "the baseline's row\n" << r.out;
}

TEST_F(CliBench, NamedFileIsReadAndKept) {
  const fs::path file = dir_ / "data.bin";
  {
    std::ofstream out(file, std::ios::binary);
    out << std::string(3u << 20, 'x');
  }
  CliRun r = run_cli("bench --memory host -i 1MiB --json -f " + file.string(), "", false);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["file"], file.string());
  EXPECT_EQ(j["file_size"], 3u << 20);
  EXPECT_EQ(j["bytes"], 3u << 20);
  EXPECT_TRUE(fs::exists(file));
  CliRun missing = run_cli("bench --memory host -f " + (dir_ / "none").string());
  EXPECT_EQ(missing.status, 1);
  EXPECT_TRUE(has(missing.out, "no such file to read")) << missing.out;
}

TEST_F(CliBench, FailedCaseIsALineAndTheExitStatus) {
  // cuFile serves GPU memory only: require=cufile refuses host memory, and the sweep goes on.
  auto lines = bench("-s 2MiB -i 1MiB --memory host --route posix,cufile", 1);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_FALSE(lines[0].contains("error"));
  EXPECT_EQ(lines[1]["route"], "cufile");
  EXPECT_TRUE(has(lines[1]["error"], "require=cufile")) << lines[1].dump();
}

TEST_F(CliBench, Refusals) {
  struct Case {
    std::string args;
    std::string says;
  } cases[] = {
      {"-I 9", "expected read, write, randread, randwrite"},
      {"--route fast", "expected auto, posix, cufile or gds"},
      {"--memory disk", "expected gpu:N, pinned, host or auto"},
      {"-I write --cold", "--cold applies to reads"},
      {"-i 1MiB -w 2", "fewer than one per thread"},
      {"--total 1MiB -T 1", "excludes"},
  };
  for (const Case& c : cases) {
    CliRun r = run_cli("bench -s 1MiB -D " + dir_.string() + " " + c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_TRUE(has(r.out, c.says)) << c.args << "\n" << r.out;
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(CliBench, HelpMapsGdsio) {
  CliRun r = run_cli("bench --help");
  ASSERT_EQ(r.status, 0);
  for (const char* text : {"-x 0 GPU_DIRECT", "-x 1 CPU_ONLY", "-x 2 CPU_GPU", "no ferry",
                           "-I 0|1|2|3", "posix_fadvise(DONTNEED)", "--depth", "O_DIRECT"})
    EXPECT_TRUE(has(r.out, text)) << text;
}

}  // namespace
}  // namespace ferry::test
