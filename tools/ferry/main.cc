// The ferry command-line tool: subcommands on top of the public API. Errors print one line and
// exit non-zero.
#include <ferry/ferry.h>
#include <ferry/version.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "ferry: move file bytes into GPU or host memory by the fastest real path, and say "
      "which path each request took"};
  app.set_version_flag("--version", std::string("ferry ") + FERRY_VERSION_STRING,
                       "Print the version (the same as ferry.__version__ and the CMake package)");
  app.require_subcommand(1);
  std::function<int()> action;
  ferry::cli::add_read_command(app, action);
  ferry::cli::add_write_command(app, action);
  ferry::cli::add_demo_command(app, action);
  ferry::cli::add_check_command(app, action);
  ferry::cli::add_explain_command(app, action);
  ferry::cli::add_plan_command(app, action);
  ferry::cli::add_stats_command(app, action);
  ferry::cli::add_load_command(app, action);
  ferry::cli::add_bench_command(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return action ? action() : 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ferry: {}\n", e.what());
    return 1;
  }
}
