// The ferry command-line tool: subcommands on top of the public API. Every error is one line on
// stderr, "ferry: ...", and the exit status says which kind (docs/cli.md, "Exit status"):
// 0 done, 1 the work failed, 2 the command line or a setting was refused before any work.
#include <ferry/ferry.h>
#include <ferry/version.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "common.h"

namespace {

constexpr int kWorkFailed = 1;
constexpr int kUsage = 2;

// The subcommand named on the command line (the first word that is not an option), or null.
CLI::App* chosen_command(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.starts_with("-")) continue;
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      if (sub->get_name() == word) return sub;
    }
    return nullptr;
  }
  return nullptr;
}

// "unknown command 'raed': did you mean 'read'?" when the first word is no command.
std::string unknown_command(CLI::App& app, const std::string& word) {
  std::vector<std::string> names;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  std::string text = fmt::format("unknown command '{}'", word);
  if (auto near = ferry::nearest_name(word, names))
    return text + fmt::format(": did you mean '{}'?", *near);
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
  return text + fmt::format("; the commands are {} (ferry --help)", all);
}

bool looks_like_number(const std::string& word) {
  return word.size() > 1 && (std::isdigit(static_cast<unsigned char>(word[1])) || word[1] == '.');
}

// The first option of `argv` that `command` does not have, with the nearest one it has.
std::string unknown_option(CLI::App& command, int argc, char** argv) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : command.get_options()) {
    for (const auto& l : opt->get_lnames()) names.push_back("--" + l);
    for (const auto& s : opt->get_snames()) names.push_back("-" + s);
  }
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;
    if (!word.starts_with("-") || looks_like_number(word)) continue;
    const std::string name = word.substr(0, word.find('='));
    if (command.get_option_no_throw(name) != nullptr) continue;
    if (!name.starts_with("--") && name.size() > 2 &&
        command.get_option_no_throw(name.substr(0, 2)) != nullptr)
      continue;  // a short option with its value attached: -w4
    std::string text = fmt::format("unknown option '{}' for 'ferry {}'", name, command.get_name());
    if (auto near = ferry::nearest_name(name, names))
      return text + fmt::format(": did you mean '{}'?", *near);
    return text + fmt::format(" (ferry {} --help lists them)", command.get_name());
  }
  return {};
}

// CLI11's message made one line in ferry's words; `command` is the subcommand when one was named.
std::string usage_error(const CLI::ParseError& e, CLI::App& app, CLI::App* command, int argc,
                        char** argv) {
  const std::string where = command ? fmt::format("{}: ", command->get_name()) : "";
  std::string what = e.what();
  if (command == nullptr) {
    for (int i = 1; i < argc; ++i) {
      if (!std::string(argv[i]).starts_with("-")) return unknown_command(app, argv[i]);
    }
  } else if (std::string text = unknown_option(*command, argc, argv); !text.empty()) {
    // A misspelt option is the cause whatever CLI11 met first ("--szie" leaves --size missing).
    return text;
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && command == nullptr) {
    std::string names;
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
      names += (names.empty() ? "" : ", ") + sub->get_name();
    return fmt::format(
        "no command given: ferry COMMAND ..., where COMMAND is one of {} "
        "(ferry --help)",
        names);
  }
  // CLI11 writes "OPTION: must ..." for a failed check: "OPTION must ...".
  if (auto at = what.find(": must "); at != std::string::npos) what.erase(at, 1);
  if (!what.empty()) what[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(what[0])));
  return where + what;
}

// `message` with every argument that is a URL (or an --option=URL's value) as shown_path shows
// it: whichever command, check or parser echoed an argument, its user:password@ and query never
// reach the terminal (`check --path`, `bench -f`, `demo --dir` take local paths and name them).
std::string without_credentials(std::string message, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view word = argv[i];
    if (word.starts_with("-") && word.find('=') != std::string_view::npos) {
      word.remove_prefix(word.find('=') + 1);
    }
    const std::string shown = ferry::shown_path(word);
    if (word.empty() || shown == word) continue;
    for (std::size_t at = message.find(word); at != std::string::npos;
         at = message.find(word, at + shown.size())) {
      message.replace(at, word.size(), shown);
    }
  }
  return message;
}

}  // namespace

int main(int argc, char** argv) {
  // Named "ferry" here, so usage lines say "ferry read", not the binary's full path.
  CLI::App app{
      "ferry: move file bytes into GPU or host memory by the fastest real path, and say "
      "which path each request took",
      "ferry"};
  app.set_version_flag("--version", std::string("ferry ") + FERRY_VERSION_STRING,
                       "Print the version (the same as ferry.__version__ and the CMake package)");
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 done; 1 the work failed (I/O, CUDA, a refused route); 2 the command line "
      "or a FERRY_* setting was refused before any work.");
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
  CLI::App* command = chosen_command(app, argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "ferry: {}\n",
               without_credentials(usage_error(e, app, command, argc, argv), argc, argv));
    return kUsage;
  }
  try {
    return action ? action() : 0;
  } catch (const ferry::SettingError& e) {
    // A malformed flag value or FERRY_* variable, found when the command read it.
    fmt::print(stderr, "ferry: {}\n", without_credentials(e.what(), argc, argv));
    return kUsage;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ferry: {}\n", without_credentials(e.what(), argc, argv));
    return kWorkFailed;
  }
}
