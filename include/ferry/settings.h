// ferry's settings: process-wide values, read from the environment once at first use, that code
// may change globally (set_settings), per File (SettingsOverride) or for one thread's scope
// (ScopedSettings). All functions here are thread-safe; a request takes a snapshot of its
// thread's settings when it starts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/error.h"

namespace ferry {

// Whether ferry calls cuFile: auto tries it and falls back with a reason, on never calls it,
// off always calls it and fails rather than fall back.
enum class CompatMode { kAuto, kOn, kOff };

// Strict mode: which fallbacks are refused. any refuses none; cufile refuses ferry's own
// fallback to POSIX; gds also refuses cuFile's compatibility path.
enum class Require { kAny, kCufile, kGds };

// How a checkpoint load into pageable host memory gets a shard's bytes: auto maps a local shard
// (its tensors are views of a private mapping), reading a cold one's pages in by parallel faults
// before the load returns, and reads a remote one; map maps a local file and leaves its pages to
// fault in; read always reads (docs/checkpoints.md, "Host loads").
enum class HostLoad { kAuto, kMap, kRead };

enum class SettingSource { kDefault, kEnvironment, kCode };

struct Settings {
  CompatMode compat_mode = CompatMode::kAuto;
  Require require = Require::kAny;
  std::size_t task_size = std::size_t{4} << 20;
  std::size_t gds_threshold = std::size_t{16} << 10;
  std::size_t nthreads = 8;        // workers for GPU memory; measured: bench/NOTES.md §2
  std::size_t host_nthreads = 16;  // workers for host memory; measured: bench/NOTES.md §11
  std::size_t bounce_buffer_size = std::size_t{4} << 20;  // measured: bench/NOTES.md
  HostLoad host_load = HostLoad::kAuto;                   // measured: bench/NOTES.md §31
};

// Limits of the settings; a value outside them is a SettingError naming the setting.
// task_size: a request keeps a few bytes per task, so a tiny task size on a large request would
// cost more memory than the data (1 B tasks on 1 GiB: 8 GiB); 4 KiB is also the smallest O_DIRECT
// unit. bounce_buffer_size: each worker pins two of them. Threads: each is a permanent thread.
constexpr std::size_t kMinTaskSize = std::size_t{4} << 10;
constexpr std::size_t kMaxTaskSize = std::size_t{64} << 30;
constexpr std::size_t kMinBounceSize = std::size_t{4} << 10;
constexpr std::size_t kMaxBounceSize = std::size_t{1} << 30;
constexpr std::size_t kMaxThreads = 256;

// The workers a request into memory of `kind` runs on: nthreads for GPU memory, host_nthreads
// for host memory (pageable or pinned). A remote source's requests run on host_nthreads into
// either: their limit is the connections open at once, not the copy engine (bench/NOTES.md §24).
std::size_t workers_for(const Settings& settings, bool gpu_memory, bool remote = false);

// A partial set of settings: the fields that are set replace the base ones.
struct SettingsOverride {
  std::optional<CompatMode> compat_mode;
  std::optional<Require> require;
  std::optional<std::size_t> task_size;
  std::optional<std::size_t> gds_threshold;
  std::optional<std::size_t> nthreads;
  std::optional<std::size_t> host_nthreads;
  std::optional<std::size_t> bounce_buffer_size;
  std::optional<HostLoad> host_load;

  Settings apply_to(Settings base) const;
  // Parses `value` for the setting called `name` (compat_mode, require, task_size,
  // gds_threshold, nthreads, host_nthreads, bounce_buffer_size, host_load); throws SettingError.
  void set(std::string_view name, std::string_view value);
};

// The calling thread's settings: the process-wide ones with this thread's scopes applied. The
// first call reads FERRY_* from the environment and, for a setting whose FERRY_* variable is
// unset, KvikIO's (KVIKIO_COMPAT_MODE, KVIKIO_TASK_SIZE, KVIKIO_GDS_THRESHOLD,
// KVIKIO_BOUNCE_BUFFER_SIZE, and KVIKIO_NTHREADS or KVIKIO_NUM_THREADS for both thread counts),
// parsed and limited exactly as the FERRY_* one. A malformed variable makes every call throw its
// SettingError, which names that variable, until code sets that setting with set_settings().
Settings settings();
// Changes the process-wide settings (every thread's, under their scopes). Setting a value whose
// FERRY_* variable was malformed repairs it.
void set_settings(const SettingsOverride& changes);

// One row per setting: name, environment variable, value as text (the calling thread's, as
// settings() returns it), and where it came from (kCode for values set by a scope).
struct SettingInfo {
  std::string name;
  std::string env;  // its FERRY_* variable
  std::string value;
  SettingSource source;
  // The variable the value was read from when source is kEnvironment: `env`, or one of
  // `kvikio_env` when `env` is unset. Empty for other sources.
  std::string source_env = {};
  // KvikIO's variables for this setting, honoured when `env` is unset (none for require).
  std::vector<std::string> kvikio_env = {};
  // The malformed variable's error when the environment gave a bad value; `value` is then the
  // default in use meanwhile (settings() throws this error until code sets the setting), or for
  // stats_publish off.
  std::string error = {};
  // Read from the environment only, by the part of ferry that uses it, when it uses it: the
  // remote policy (remote_*; set_remote_policy() replaces it), the published statistics
  // (stats_*) and the libraries ferry loads (*_library). set_settings() and scopes do not know
  // it; a malformed one fails only what reads it (a remote open; statistics are not published).
  bool environment_only = false;
};
// The settings, then the variables read from the environment only. Never throws for a malformed
// variable (it is reported in `error`): diagnostics go on.
std::vector<SettingInfo> describe_settings();

// The process-wide settings as settings() gives them, except that a malformed variable's
// setting is left at its default instead of throwing; `errors` lists those variables' errors,
// the environment-only ones' (describe_settings) included.
// For diagnostics (ferry check), which report them and go on.
struct SettingsCheck {
  Settings settings;
  std::vector<SettingError> errors;
};
SettingsCheck check_settings();

// settings() with `changes` layered on top, where a malformed variable is no error when
// `changes` sets that very setting (a File's or a command line's own value replaces it).
Settings settings_with(const SettingsOverride& changes);

// The name in `names` nearest to `word` (edits, a swap of neighbours counting one), when it is
// near enough to be a misspelling of it: for "did you mean" messages. Case-insensitive.
std::optional<std::string> nearest_name(std::string_view word,
                                        const std::vector<std::string>& names);

// Applies `changes` to the settings of the thread that creates it, and to no other thread's,
// until it is destroyed. Scopes of one thread nest: each is layered over the ones made before it,
// and destroying one (in any order, from any thread) removes exactly its own changes. Requests
// of other threads, and set_settings() changes, are not affected by a scope.
class ScopedSettings {
 public:
  explicit ScopedSettings(const SettingsOverride& changes);
  ~ScopedSettings();
  ScopedSettings(const ScopedSettings&) = delete;
  ScopedSettings& operator=(const ScopedSettings&) = delete;

 private:
  struct Saved;
  Saved* saved_;
};

// "4MiB", "16KiB", "1GiB", "4M", "4096" -> bytes. `setting` names the variable in the error.
// Zero, negative, fractional and unknown units are errors.
std::uint64_t parse_size(std::string_view text, std::string_view setting);
// The same forms, zero included ("0", "00", "0B"): file offsets.
std::uint64_t parse_offset(std::string_view text, std::string_view setting);
std::size_t parse_count(std::string_view text, std::string_view setting);
CompatMode parse_compat_mode(std::string_view text, std::string_view setting);
Require parse_require(std::string_view text, std::string_view setting);
HostLoad parse_host_load(std::string_view text, std::string_view setting);

std::string to_string(CompatMode mode);
std::string to_string(Require require);
std::string to_string(HostLoad mode);
std::string to_string(SettingSource source);
// 4194304 -> "4 MiB", 5000 -> "5000 B".
std::string format_size(std::uint64_t bytes);

}  // namespace ferry
