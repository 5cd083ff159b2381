// Runs a program in a child process with extra environment variables and a time limit, and
// reports how it ended and what it printed. For tests of process-wide state (settings read from
// the environment once) and of process exit. Not thread-safe.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace ferry::test {

struct ProcessResult {
  bool timed_out = false;
  bool exited = false;
  int exit_code = -1;
  int signal = 0;
  std::string output;  // stdout and stderr together
  std::string describe() const {
    if (timed_out) return "timed out (killed); output: " + output;
    if (!exited) return "killed by signal " + std::to_string(signal) + "; output: " + output;
    return "exit " + std::to_string(exit_code) + "; output: " + output;
  }
};

inline ProcessResult run_process(const std::vector<std::string>& argv,
                                 const std::vector<std::pair<std::string, std::string>>& env,
                                 double timeout_seconds) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(out[1], 2);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  ProcessResult r;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      r.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
    ssize_t n = read(out[0], buf, sizeof buf);
    if (n <= 0) break;  // the child closed its output: it has exited (or will at once)
    r.output.append(buf, static_cast<std::size_t>(n));
  }
  close(out[0]);
  int status = 0;
  if (!r.timed_out) {
    // The output closed; give the exit itself the rest of the time limit.
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        r.timed_out = true;
        kill(pid, SIGKILL);
        break;
      }
      usleep(10000);
    }
  }
  if (r.timed_out) waitpid(pid, &status, 0);
  if (r.timed_out) return r;
  r.exited = WIFEXITED(status);
  r.exit_code = r.exited ? WEXITSTATUS(status) : -1;
  r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return r;
}

}  // namespace ferry::test
