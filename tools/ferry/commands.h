// One function per subcommand: each adds itself to the app and, when chosen, sets `action` to
// the function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace ferry::cli {

void add_read_command(CLI::App& app, std::function<int()>& action);
void add_write_command(CLI::App& app, std::function<int()>& action);
void add_demo_command(CLI::App& app, std::function<int()>& action);
void add_check_command(CLI::App& app, std::function<int()>& action);
void add_explain_command(CLI::App& app, std::function<int()>& action);
void add_plan_command(CLI::App& app, std::function<int()>& action);
void add_stats_command(CLI::App& app, std::function<int()>& action);
void add_load_command(CLI::App& app, std::function<int()>& action);
void add_bench_command(CLI::App& app, std::function<int()>& action);

}  // namespace ferry::cli
