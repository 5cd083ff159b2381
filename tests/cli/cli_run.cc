#include "cli/cli_run.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include "test_data.h"

namespace ferry::test {

CliRun run_cli(const std::string& args, const std::string& env, bool merge_stderr) {
  std::string command = env + " " FERRY_CLI_PATH " " + args + (merge_stderr ? " 2>&1" : "");
  FILE* p = popen(command.c_str(), "r");
  CliRun r;
  if (p == nullptr) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  int status = pclose(p);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

nlohmann::json run_cli_json(const std::string& args, const std::string& env) {
  CliRun r = run_cli(args + " --json", env, false);
  EXPECT_EQ(r.status, 0) << args << "\n" << r.out;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << r.out;
  return j;
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

std::string fake_gpu_env() { return "FERRY_CUDA_LIBRARY=" FERRY_FAKE_CUDA_PATH; }

std::string platform_data() { return test_data("platform").string(); }

}  // namespace ferry::test
