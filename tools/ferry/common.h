// Pieces shared by the ferry subcommands: choosing and allocating the target memory, checksums,
// waiting with a progress line, CPU time. Single-threaded use.
#pragma once

#include <ferry/ferry.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::cli {

// --gpu N / --host and the settings flags common to read and write.
struct MemoryChoice : ferry::MemoryChoice {
  std::string gpu_list;  // --gpu as given where several GPUs are accepted ("0,1", "all")
};
// `several_gpus`: --gpu also takes a list ("0,1") or "all", kept in `gpu_list` (checked at
// parse time); cmd_read resolves it with parse_gpu_list and resolve_gpus.
void add_memory_options(CLI::App& cmd, MemoryChoice& choice, bool several_gpus = false);

// "a,b,,c" -> {"a", "b", "", "c"}: the items of a comma-separated option, empty ones kept.
std::vector<std::string> split_list(const std::string& text);
// Whether `text` is a GPU ordinal as the options write one: 1 to 4 decimal digits.
bool is_gpu_ordinal(const std::string& text);

// --gpu's text parsed without asking CUDA: "all", or distinct ordinals separated by commas.
// Throws ferry::Error for anything else ("0,,1", "x", "0,0", "-1").
struct GpuList {
  bool all = false;
  std::vector<int> ordinals;
};
GpuList parse_gpu_list(const std::string& text);
// The GPUs a GpuList names on this machine: every GPU for "all". Without a CUDA driver it
// throws the CudaError `--gpu 0` throws; for a GPU that does not exist, an Error naming it.
std::vector<int> resolve_gpus(const GpuList& list);

struct SettingsFlags {
  std::string task_size;
  std::string threads;
  std::string compat;
  std::string require;
  std::string bounce;
  bool direct = false;
};
void add_settings_options(CLI::App& cmd, SettingsFlags& flags);
FileOptions file_options(const SettingsFlags& flags);

// The memory a command will use: ferry::choose_memory's, as plan and explain predict it, with
// its failure thrown as a CudaError.
ChosenMemory choose_memory_or_throw(const ferry::MemoryChoice& choice);
// --json's fields for that memory: memory ("gpu" or "host"), memory_kind, device, and the note
// saying why it is not the memory asked for, where there is one.
nlohmann::json memory_json(const ChosenMemory& target);

// SHA-256 (hex) of `size` bytes of `buffer` from `offset`, copied back in chunks where needed.
std::string sha256(const Buffer& buffer, std::size_t size, std::size_t offset = 0);
// SHA-256 (hex) of several buffers' first bytes, one after the other, as if one.
std::string sha256(const std::vector<std::pair<const Buffer*, std::size_t>>& parts);

// Fills `buffer` with a pattern: "random" (deterministic from `seed`) or "zero".
void fill_pattern(Buffer& buffer, const std::string& pattern, std::uint64_t seed);

// Waits for `future` of `total` bytes, drawing a progress line (progress.h) while it runs when
// `show` (progress_wanted(json)) and the request takes long enough to be worth one.
void wait_with_progress(const IoFuture& future, std::uint64_t total, const char* verb, bool show);

// A fatal signal's cleanup of a temporary file: until forget_signal_temp(), each of `signals`
// unlinks `path`, then ends the process as it would have (the handler only unlinks, which is
// async-signal-safe). One such file at a time; a path too long for the handler's copy is left.
void remove_on_signals(const std::string& path, std::initializer_list<int> signals);
void forget_signal_temp();

// `j` as JSON text for --json output: a string that is not UTF-8 (a path's bytes) has its bad
// bytes replaced by U+FFFD instead of failing the command after its work is done.
std::string json_text(const nlohmann::json& j, int indent = -1);

// Seconds of wall time since `t0`.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU seconds (user + system) used by this process so far.
double cpu_seconds();

// CPU seconds per GiB moved (0 when nothing moved), and the same in words whatever the size:
// "0.160 CPU-s/GiB".
double cpu_seconds_per_gib(double cpu_seconds, std::uint64_t bytes);
std::string cpu_words(double cpu_seconds, std::uint64_t bytes);

// CLI11 checks whose failure says the accepted range in words, never a bound such as DBL_MAX:
// "--pid must be a process id from 1 to 4194304, not 'abc'". `what` names the quantity. The
// check's name is the same words ("a process id from 1 to 4194304"), for a missing value.
CLI::Validator whole_number(const std::string& what, long long low, long long high);
// A finite number of seconds above 0 and at most `most`.
CLI::Validator seconds_above_zero(double most);

// "1.07 GB/s" style helpers.
double gbps(std::uint64_t bytes, double seconds);

}  // namespace ferry::cli
