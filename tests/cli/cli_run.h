// Test helper: runs the built ferry binary through the shell and captures what it prints.
// Not thread-safe (popen).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace ferry::test {

struct CliRun {
  int status = -1;  // exit status, -1 when killed
  std::string out;  // stdout (and stderr when `merge_stderr`)
};

// `env` is prefixed to the command line ("FERRY_TASK_SIZE=8MiB").
CliRun run_cli(const std::string& args, const std::string& env = "", bool merge_stderr = true);

// Runs with --json appended and parses stdout; fails the test on a non-zero exit.
nlohmann::json run_cli_json(const std::string& args, const std::string& env = "");

bool has(const std::string& text, const std::string& what);

// "FERRY_CUDA_LIBRARY=<the test double of libcuda>": one GPU, for a command that must see one.
std::string fake_gpu_env();

// tests/data/platform (test_data.h).
std::string platform_data();

}  // namespace ferry::test
