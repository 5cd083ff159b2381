// The ferry command-line tool: subcommands on top of the public API. Every error is one line on
// stderr, "ferry: ...", and the exit status says which kind (docs/cli.md, "Exit status"):
// 0 done, 1 the work failed, 2 the command line or a setting was refused before any work.
#include <ferry/ferry.h>
#include <ferry/version.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

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

// The commands' names, in the order --help lists them.
std::vector<std::string> command_names(CLI::App& app) {
  std::vector<std::string> names;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  return names;
}

// "unknown command 'raed': did you mean 'read'?" when the first word is no command.
std::string unknown_command(CLI::App& app, const std::string& word) {
  const std::vector<std::string> names = command_names(app);
  std::string text = fmt::format("unknown command '{}'", word);
  if (auto near = ferry::nearest_name(word, names))
    return text + fmt::format(": did you mean '{}'?", *near);
  return text + fmt::format("; the commands are {} (ferry --help)", fmt::join(names, ", "));
}

bool looks_like_number(const std::string& word) {
  return word.size() > 1 && (std::isdigit(static_cast<unsigned char>(word[1])) || word[1] == '.');
}

// The first option among `words` that `owner` does not have, with the nearest one it has.
// `label` is how the message names `owner`: " for 'ferry read'", or empty for ferry itself.
std::string unknown_option(const CLI::App& owner, const std::string& label,
                           const std::vector<std::string>& words) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : owner.get_options()) {
    for (const auto& l : opt->get_lnames()) names.push_back("--" + l);
    for (const auto& s : opt->get_snames()) names.push_back("-" + s);
  }
  for (const std::string& word : words) {
    if (word == "--") break;
    if (!word.starts_with("-") || looks_like_number(word)) continue;
    const std::string name = word.substr(0, word.find('='));
    if (owner.get_option_no_throw(name) != nullptr) continue;
    if (!name.starts_with("--") && name.size() > 2 &&
        owner.get_option_no_throw(name.substr(0, 2)) != nullptr)
      continue;  // a short option with its value attached: -w4
    std::string text = fmt::format("unknown option '{}'{}", name, label);
    if (auto near = ferry::nearest_name(name, names))
      return text + fmt::format(": did you mean '{}'?", *near);
    return text + fmt::format(" ({} --help lists them)",
                              label.empty() ? "ferry" : "ferry " + owner.get_name());
  }
  return {};
}

// An unknown option anywhere on the line: before the command word it is ferry's own ("ferry
// --verison"), after it the command's.
std::string unknown_option(CLI::App& app, CLI::App* command, int argc, char** argv) {
  std::vector<std::string> before, after;
  bool past_command = false;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (command != nullptr && !past_command && word == command->get_name()) {
      past_command = true;
      continue;
    }
    (past_command ? after : before).push_back(word);
  }
  if (std::string text = unknown_option(app, "", before); !text.empty()) return text;
  if (command == nullptr) return {};
  return unknown_option(*command, fmt::format(" for 'ferry {}'", command->get_name()), after);
}

// The option of `owner` that a CLI11 message names first ("-p,--pid: ..."), or null.
CLI::Option* named_option(CLI::App& owner, const std::string& what) {
  for (const std::string& name : ferry::cli::split_list(what.substr(0, what.find_first_of(": ")))) {
    if (CLI::Option* opt = owner.get_option_no_throw(name)) return opt;
  }
  return nullptr;
}

// "-p/--pid": an option's names as a user types them.
std::string typed_names(const CLI::Option& opt) {
  std::string names;
  for (const auto& s : opt.get_snames()) names += (names.empty() ? "-" : "/-") + s;
  for (const auto& l : opt.get_lnames()) names += (names.empty() ? "--" : "/--") + l;
  return names;
}

// What an option's value must be, in words: its check's own words where it has one
// (whole_number's "a process id from 1 to 4194304"), else its help text.
std::string expected_value(CLI::Option& opt) {
  try {
    if (const std::string& words = opt.get_validator()->get_name(); !words.empty()) return words;
  } catch (const CLI::OptionNotFound&) {
    // no check: the help text says what the value is
  }
  std::string help = opt.get_description();
  if (help.size() > 1 && !std::isupper(static_cast<unsigned char>(help[1])))  // "GPU" stays
    help[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(help[0])));
  return help.empty() ? "a value" : fmt::format("a value ({})", help);
}

// CLI11's texts for a value missing or of the wrong type ("-p,--pid: 1 required
// INT:1..4194304 missing", "Could not convert: --seed = x") in words naming the option and what
// it takes; empty for any other error.
std::string value_error(const CLI::ParseError& e, CLI::App& owner) {
  std::string what = e.what();
  // Not its other texts ("--json was given a disallowed flag override"): they stay CLI11's.
  const bool missing = dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr &&
                       what.find(" required ") != std::string::npos;
  const bool unconverted = dynamic_cast<const CLI::ConversionError*>(&e) != nullptr &&
                           what.starts_with("Could not convert: ");
  if (!missing && !unconverted) return {};
  if (unconverted) what.erase(0, std::string_view("Could not convert: ").size());
  CLI::Option* opt = named_option(owner, what);
  if (opt == nullptr) return {};
  if (missing) return fmt::format("{} needs {}", typed_names(*opt), expected_value(*opt));
  const std::size_t eq = what.find(" = ");
  const std::string given = eq == std::string::npos ? std::string() : what.substr(eq + 3);
  return fmt::format("{} takes {}, not '{}'", typed_names(*opt), expected_value(*opt), given);
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
  }
  // A misspelt option is the cause whatever CLI11 met first ("--szie" leaves --size missing,
  // "--verison" leaves the command missing).
  if (std::string text = unknown_option(app, command, argc, argv); !text.empty()) return text;
  if (std::string text = value_error(e, command ? *command : app); !text.empty())
    return where + text;
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && command == nullptr) {
    return fmt::format(
        "no command given: ferry COMMAND ..., where COMMAND is one of {} "
        "(ferry --help)",
        fmt::join(command_names(app), ", "));
  }
  // CLI11 writes "OPTION: must ..." for a failed check: "OPTION must ...".
  if (auto at = what.find(": must "); at != std::string::npos) what.erase(at, 1);
  if (!what.empty()) what[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(what[0])));
  return where + what;
}

// For a command that moves bytes, where it can put them without a CUDA driver: said after a
// CUDA error on a machine that has no driver, as the Python API says "pass device='cpu'".
std::string without_driver(const CLI::App* command) {
  const std::string name = command ? command->get_name() : "";
  if (name == "read" || name == "load") return "to read into host memory, pass --host";
  if (name == "write") return "to write from host memory, pass --host";
  if (name == "bench") return "to measure host memory, pass --memory host (or -x 1)";
  return {};
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

// `ferry help [COMMAND]` as `ferry [COMMAND] --help`: the word users try first. A word that is
// no command stays, so that it is named as unknown.
std::vector<char*> with_help_word(int argc, char** argv, CLI::App& app) {
  std::vector<char*> args(argv, argv + argc);
  static char help[] = "--help";
  if (argc < 2 || std::string_view(argv[1]) != "help") return args;
  args.erase(args.begin() + 1);
  bool command = argc == 2;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    command = command || sub->get_name() == argv[2];
  if (command) args.push_back(help);
  return args;
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
  std::vector<char*> words = with_help_word(argc, argv, app);
  argc = static_cast<int>(words.size());
  argv = words.data();
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
  } catch (const ferry::CudaError& e) {
    // Checked against the machine, not the message: CUDA errors of other kinds keep their text.
    const std::string hint = without_driver(command);
    if (hint.empty() || ferry::cuda_status().available) {
      fmt::print(stderr, "ferry: {}\n", without_credentials(e.what(), argc, argv));
    } else {
      fmt::print(stderr, "ferry: {}: {}; {}\n", command->get_name(),
                 without_credentials(e.what(), argc, argv), hint);
    }
    return kWorkFailed;
  } catch (const std::exception& e) {
    fmt::print(stderr, "ferry: {}\n", without_credentials(e.what(), argc, argv));
    return kWorkFailed;
  }
}
