#include "plot.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common.h"
#include "plot_script.h"

extern char** environ;

namespace ferry::cli {
namespace {

namespace fs = std::filesystem;

// Runs argv, waits, and returns its exit status (128 + signal for a signal, -1 when it could not
// be started). Its stdout goes to /dev/null (the caller says what was drawn; `ferry bench --json
// --plot` keeps stdout for the JSON lines); its stderr too where `quiet`, else to ours.
int run_child(const std::vector<std::string>& argv, bool quiet) {
  std::vector<char*> args;
  for (const std::string& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  if (quiet) posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

}  // namespace

std::string plot_results_path(const std::string& output) {
  return fs::path(output).replace_extension(".jsonl").string();
}

std::string check_plot(const std::string& output) {
  const std::string suffix = fs::path(output).extension().string();
  if (suffix != ".png" && suffix != ".svg" && suffix != ".pdf") {
    throw Error(
        fmt::format("--plot '{}': expected a file name ending in .png, .svg or .pdf", output));
  }
  const fs::path folder = fs::path(output).parent_path();
  std::error_code ec;
  if (!folder.empty() && !fs::is_directory(folder, ec)) {
    throw Error(fmt::format("--plot '{}': no folder {}", output, folder.string()));
  }
  std::vector<std::string> candidates;
  const char* chosen = std::getenv("FERRY_PYTHON");
  if (chosen != nullptr && *chosen != '\0') {
    candidates.emplace_back(chosen);
  } else {
    candidates = {"python3", "/usr/bin/python3"};
  }
  for (const std::string& python : candidates) {
    if (run_child({python, "-c", "import matplotlib"}, true) == 0) return python;
  }
  throw Error(fmt::format(
      "--plot needs a Python interpreter with matplotlib, and {} has none (on Debian: apt-get "
      "install python3-matplotlib; FERRY_PYTHON names another interpreter); nothing was measured",
      chosen != nullptr && *chosen != '\0' ? fmt::format("FERRY_PYTHON={}", chosen)
                                           : std::string("neither python3 nor /usr/bin/python3")));
}

void draw_plot(const std::string& python, const std::string& output,
               const std::vector<nlohmann::json>& records) {
  const std::string results = plot_results_path(output);
  {
    std::ofstream out(results, std::ios::trunc);
    for (const nlohmann::json& r : records) out << json_text(r) << '\n';
    out.flush();
    if (!out) throw Error(fmt::format("--plot: cannot write the results to {}", results));
  }
  std::string script = (fs::temp_directory_path() / "ferry-plot-XXXXXX.py").string();
  const int fd = ::mkstemps(script.data(), 3);
  if (fd < 0) {
    throw Error(
        fmt::format("--plot: cannot create the drawing script in {}: {} (the results "
                    "are in {})",
                    fs::temp_directory_path().string(), std::strerror(errno), results));
  }
  const std::string text = kPlotScript;
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  const int rc = written ? run_child({python, script, results, "-o", output}, false) : -1;
  ::unlink(script.c_str());
  if (rc != 0) {
    throw Error(fmt::format("--plot: {} could not draw {} ({}); the results are in {}", python,
                            output, rc < 0 ? "it did not start" : fmt::format("exit {}", rc),
                            results));
  }
}

}  // namespace ferry::cli
