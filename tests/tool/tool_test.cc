#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace {

using ferry::test::TempDir;

struct CliRun {
  int status;
  std::string out;  // stdout and stderr together
};

CliRun run(const std::string& args, const std::string& env = "") {
  std::string command = env + " " FERRY_CLI_PATH " " + args + " 2>&1";
  FILE* p = popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string sha256_hex(const std::vector<unsigned char>& data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  char two[3];
  for (unsigned int i = 0; i < length; ++i) {
    std::snprintf(two, sizeof two, "%02x", digest[i]);
    hex += two;
  }
  return hex;
}

TEST(Cli, DemoWritesReadsVerifiesAndCleansUp) {
  TempDir dir;
  CliRun r = run("demo --size 8MiB --dir " + dir.path().string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("data verified"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("route:"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "demo left files behind";
}

TEST(Cli, ReadChecksumMatchesAnIndependentSha256) {
  TempDir dir;
  auto data = ferry::test::random_bytes(3'000'017, 51);
  ferry::test::write_file(dir / "c.bin", data);
  CliRun r =
      run("read " + (dir / "c.bin").string() + " --host --checksum --offset 17 --task-size 64KiB");
  ASSERT_EQ(r.status, 0) << r.out;
  std::vector<unsigned char> tail(data.begin() + 17, data.end());
  EXPECT_NE(r.out.find("sha256: " + sha256_hex(tail)), std::string::npos) << r.out;
}

TEST(Cli, ReadJsonHasTheDocumentedFields) {
  TempDir dir;
  auto data = ferry::test::random_bytes(1 << 20, 52);
  ferry::test::write_file(dir / "j.bin", data);
  CliRun r = run("read " + (dir / "j.bin").string() + " --host --json --checksum --direct");
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bytes"], 1 << 20);
  EXPECT_EQ(j["memory"], "host");
  EXPECT_TRUE(j["seconds"].is_number());
  EXPECT_TRUE(j["gbps"].is_number());
  EXPECT_EQ(j["sha256"], sha256_hex(data));
  EXPECT_EQ(j["route"]["layer1"]["posix_tasks"], 1);
  EXPECT_TRUE(j["route"]["layer1"]["reasons"].is_array());
  EXPECT_TRUE(j["route"]["verdict"].is_string());
}

TEST(Cli, WriteChecksumMatchesTheFileAndLeavesNoPartialFile) {
  TempDir dir;
  auto path = dir / "w.bin";
  CliRun r = run("write " + path.string() + " --host --size 1000003 --checksum --json");
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bytes"], 1000003);
  EXPECT_EQ(j["sha256"], sha256_hex(ferry::test::read_file(path)));
  for (auto& entry : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path(), path) << "unexpected file " << entry.path();
  }
}

TEST(Cli, FailedWriteLeavesNothingThatLooksComplete) {
  TempDir dir;
  // Writing into a folder that does not exist fails before any byte is written.
  CliRun r = run("write " + (dir / "no/such/dir/x.bin").string() + " --host --size 1MiB");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("no/such/dir"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(Cli, BadEnvironmentValueNamesTheVariable) {
  TempDir dir;
  ferry::test::write_file(dir / "e.bin", {1, 2, 3});
  CliRun r = run("read " + (dir / "e.bin").string() + " --host", "FERRY_TASK_SIZE=4XB");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("FERRY_TASK_SIZE='4XB'"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line expected: " << r.out;
}

TEST(Cli, BadOptionValueNamesTheOption) {
  TempDir dir;
  ferry::test::write_file(dir / "o.bin", {1, 2, 3});
  CliRun r = run("read " + (dir / "o.bin").string() + " --host --task-size 0");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("--task-size='0'"), std::string::npos) << r.out;
}

TEST(Cli, MissingFileIsOneLineAndNonZero) {
  CliRun r = run("read /nonexistent/ferry.bin --host");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "ferry: open /nonexistent/ferry.bin: No such file or directory\n");
}

TEST(Cli, GpuWithoutDriverSaysSo) {
  TempDir dir;
  ferry::test::write_file(dir / "g.bin", {1, 2, 3});
  CliRun r = run("read " + (dir / "g.bin").string() + " --gpu 0",
                 "FERRY_CUDA_LIBRARY=/nonexistent/libcuda.so.1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("no CUDA driver: /nonexistent/libcuda.so.1 not found"), std::string::npos)
      << r.out;
}

TEST(Cli, EveryCommandHasHelp) {
  for (const char* command : {"", "read", "write", "demo"}) {
    CliRun r = run(std::string(command) + " --help");
    EXPECT_EQ(r.status, 0) << command << ": " << r.out;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << command;
  }
}

}  // namespace
