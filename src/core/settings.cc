// Process-wide settings, and the scopes each thread layers on them. One table lists every setting
// once: its name, its environment variable (and KvikIO's, read when ferry's is unset), and how to
// read, parse and print it; the environment, the string setter and the report all go through
// that table.
#include "ferry/settings.h"

#include <fmt/format.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/text.h"
#include "base/variables.h"
#include "ferry/error.h"

namespace ferry {
namespace {

struct Descriptor {
  const char* name;
  // Its FERRY_* variable and KvikIO's (up to two, which must agree), read when that one is
  // unset, so that a process configured for KvikIO keeps its configuration.
  const base::Variable& var;
  void (*parse)(SettingsOverride&, std::string_view value, std::string_view env);
  bool (*is_set)(const SettingsOverride&);
  std::string (*print)(const Settings&);
};

// One row per setting: its name (the field's, in Settings and SettingsOverride alike), its
// variables, how a value is parsed and how the setting is printed. (clang-format would split
// the stringified name from its brace.)
// clang-format off
#define FERRY_SETTING(field, var, parse, print)                                         \
  Descriptor{#field, base::var,                                                         \
             [](SettingsOverride& o, std::string_view v, std::string_view e) {          \
               o.field = parse(v, e);                                                   \
             },                                                                         \
             [](const SettingsOverride& o) { return o.field.has_value(); },             \
             [](const Settings& s) { return print(s.field); }}
// clang-format on

constexpr std::array<Descriptor, 8> kTable{{
    FERRY_SETTING(compat_mode, kCompatMode, parse_compat_mode, to_string),
    FERRY_SETTING(require, kRequire, parse_require, to_string),
    FERRY_SETTING(task_size, kTaskSize, parse_size, format_size),
    FERRY_SETTING(gds_threshold, kGdsThreshold, parse_size, format_size),
    FERRY_SETTING(nthreads, kNthreads, parse_count, std::to_string),
    FERRY_SETTING(host_nthreads, kHostNthreads, parse_count, std::to_string),
    FERRY_SETTING(bounce_buffer_size, kBounceBufferSize, parse_size, format_size),
    FERRY_SETTING(host_load, kHostLoad, parse_host_load, to_string),
}};
#undef FERRY_SETTING

// Bumped by every process-wide change, under Global::mu. Process-wide, as the settings are;
// outside Global so that every request's settings() reads it with no guard check.
constinit std::atomic<std::uint64_t> version{1};

struct Global {
  std::mutex mu;
  bool loaded = false;
  Settings current;
  std::array<SettingSource, kTable.size()> sources{};
  // The variable each kEnvironment value was read from (FERRY_* or KVIKIO_*).
  std::array<std::string, kTable.size()> source_env;
  // A malformed FERRY_* variable, per setting, until code sets that setting (set_settings), which
  // repairs it: settings() throws the first one left.
  std::array<std::optional<SettingError>, kTable.size()> env_errors;
};

Global& global() {
  // Process-wide: the settings are the process's (its environment, set_settings from any
  // runtime's callers). Leaked on purpose: pool threads may still read settings while the process
  // exits.
  static Global* g = [] {
    auto* made = new Global;
    // A thread of the parent may hold the lock at fork(): the child starts with a free one. (`g`
    // is null only in a child forked while it was being made, which has no settings to unlock.)
    pthread_atfork(nullptr, nullptr, [] {
      if (g != nullptr) new (&g->mu) std::mutex;
    });
    return made;
  }();
  return *g;
}

// Parses `value` of the variable `var` for setting `d` and checks it against the setting's
// limits; every error names the variable.
SettingsOverride parse_variable(const Descriptor& d, const char* var, const char* value) {
  SettingsOverride one;
  d.parse(one, value, var);
  try {
    one.apply_to(Settings{});  // within its limits
  } catch (const SettingError& e) {
    throw SettingError(var, value, fmt::format("invalid {}='{}': {}", var, value, e.what()));
  }
  return one;
}

struct Variable {
  const char* name;
  const char* value;
};

// The variable setting `d` is read from: its FERRY_* one when set, else the KvikIO one that is
// set. KvikIO's two names for the thread count must agree when both are set (KvikIO's rule too);
// nullopt when no variable is set. Throws the SettingError of a malformed or conflicting one.
std::optional<Variable> find_variable(const Descriptor& d) {
  if (const char* value = std::getenv(d.var.env)) return Variable{d.var.env, value};
  std::optional<Variable> found;
  for (const char* var : d.var.kvikio) {
    if (var == nullptr) continue;
    const char* value = std::getenv(var);
    if (value == nullptr) continue;
    if (found) {
      Settings first = parse_variable(d, found->name, found->value).apply_to(Settings{});
      Settings second = parse_variable(d, var, value).apply_to(Settings{});
      if (d.print(first) != d.print(second)) {
        throw SettingError(
            var, value,
            fmt::format("invalid {}='{}': {} is also set, to '{}'; KvikIO's two names for the "
                        "thread count must agree (or set {}, which takes precedence over both)",
                        var, value, found->name, found->value, d.var.env));
      }
      continue;
    }
    found = Variable{var, value};
  }
  return found;
}

// Says once per process, on stderr, which FERRY_* variables look like misspellings of one that
// ferry reads (base/variables.h lists them all): a variable nobody reads would otherwise be
// ignored without a word. Variables far from every known name (test and build ones) are left
// alone.
void warn_misspelt_variables() {
  static std::atomic<bool> warned{false};  // process-wide: the environment is the process's
  if (warned.exchange(true)) return;
  std::vector<std::string> known;
  for (const base::Variable* v : base::kVariables) known.emplace_back(v->env);
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    if (!entry.starts_with("FERRY_")) continue;
    const std::string name(entry.substr(0, entry.find('=')));
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    if (std::optional<std::string> near = nearest_name(name, known)) {
      fmt::print(stderr,
                 "ferry: warning: {} is not a ferry setting and is ignored; did you mean {}?\n",
                 name, *near);
    }
  }
}

// Reads the environment on first use. Each variable is parsed and checked on its own: a
// malformed one is kept as that setting's error (and its default used meanwhile), so code can
// repair it by setting that one setting.
Global& loaded_global() {
  Global& g = global();
  if (g.loaded) return g;
  warn_misspelt_variables();
  SettingsOverride env;
  for (size_t i = 0; i < kTable.size(); ++i) {
    try {
      std::optional<Variable> var = find_variable(kTable[i]);
      if (!var) continue;
      parse_variable(kTable[i], var->name, var->value);
      kTable[i].parse(env, var->value, var->name);
      g.sources[i] = SettingSource::kEnvironment;
      g.source_env[i] = var->name;
    } catch (const SettingError& e) {
      g.env_errors[i] = e;
    }
  }
  g.current = env.apply_to(Settings{});
  g.loaded = true;
  return g;
}

// Throws the first malformed variable that code has not replaced yet.
void throw_env_error(const Global& g) {
  for (const auto& error : g.env_errors) {
    if (error) throw *error;
  }
}

// The scopes of one thread, innermost last. A scope may end in any thread (a Python context
// manager can be exited from another one), so the list has its own lock; the owning thread
// reads it under that lock only when `generation` (bumped under it) has moved.
struct ThreadScopes {
  std::mutex mu;
  std::vector<std::pair<const void*, SettingsOverride>> layers;
  std::atomic<std::uint64_t> generation{1};
};

std::shared_ptr<ThreadScopes>& this_thread_scopes() {
  // Per thread by design: a scope holds for the thread that opened it, whichever runtime it uses.
  thread_local auto scopes = std::make_shared<ThreadScopes>();
  return scopes;
}

void mark_code(Global& g, const SettingsOverride& changes) {
  for (size_t i = 0; i < kTable.size(); ++i) {
    if (kTable[i].is_set(changes)) {
      g.sources[i] = SettingSource::kCode;
      g.source_env[i].clear();
    }
  }
}

// A thread's settings as its last settings() made them. Trivially constructed and destroyed, so
// that reaching it is one thread-pointer offset, with no guard or wrapper call: every request
// reads it (bench/NOTES.md §45).
struct ThreadView {
  std::uint64_t seen = 0;          // the global version `base` was copied at
  std::uint64_t seen_layers = 0;   // the scopes' generation `effective` was made at
  ThreadScopes* scopes = nullptr;  // this_thread_scopes(), once looked up
  Settings base;
  Settings effective;
};
// Per thread by design: the copy is what keeps the request path off the lock.
constinit thread_local ThreadView view;

// The variables that rooms below core read themselves when they use them (base/variables.h):
// their rows, each as that room will read it now; a malformed one's error beside its default, and
// in `errors`.
std::vector<SettingInfo> read_below_core(std::vector<SettingError>* errors = nullptr) {
  std::vector<SettingInfo> rows;
  for (const base::Variable* v : base::kVariables) {
    if (v->form == base::Form::kSetting) continue;
    SettingInfo& row =
        rows.emplace_back(SettingInfo{v->name, v->env, v->fallback, SettingSource::kDefault});
    row.environment_only = true;
    for (const char* var : v->kvikio) {
      if (var != nullptr) row.kvikio_env.emplace_back(var);
    }
    try {
      const base::Reading read = base::read(*v);
      row.value = read.value;
      if (read.env != nullptr) {
        row.source = SettingSource::kEnvironment;
        row.source_env = read.env;
      }
    } catch (const SettingError& e) {
      // In its place: the default, except that a malformed switch is off (stats_publish).
      if (v->form == base::Form::kSwitch) row.value = "off";
      row.error = e.what();
      if (errors != nullptr) errors->push_back(e);
    }
  }
  return rows;
}

}  // namespace

std::size_t workers_for(const Settings& settings, bool gpu_memory, bool remote) {
  return gpu_memory && !remote ? settings.nthreads : settings.host_nthreads;
}

Settings SettingsOverride::apply_to(Settings base) const {
  if (compat_mode) base.compat_mode = *compat_mode;
  if (require) base.require = *require;
  if (task_size) base.task_size = *task_size;
  if (gds_threshold) base.gds_threshold = *gds_threshold;
  if (nthreads) base.nthreads = *nthreads;
  if (host_nthreads) base.host_nthreads = *host_nthreads;
  if (bounce_buffer_size) base.bounce_buffer_size = *bounce_buffer_size;
  if (host_load) base.host_load = *host_load;
  // Every value, set from text or directly, within its limits (settings.h says why each).
  auto within = [](const char* name, std::size_t value, std::size_t min, std::size_t max,
                   bool bytes) {
    if (value < min || value > max) {
      std::string shown = std::to_string(value);
      if (bytes && format_size(value) != shown + " B") {
        shown = fmt::format("{} ({} B)", format_size(value), value);
      }
      throw SettingError(
          name, std::to_string(value),
          bytes ? fmt::format("invalid {}={}: must be from {} to {}", name, shown, format_size(min),
                              format_size(max))
                : fmt::format("invalid {}={}: must be from {} to {}", name, value, min, max));
    }
  };
  within("task_size", base.task_size, kMinTaskSize, kMaxTaskSize, true);
  within("gds_threshold", base.gds_threshold, 1, SIZE_MAX, true);
  within("bounce_buffer_size", base.bounce_buffer_size, kMinBounceSize, kMaxBounceSize, true);
  within("nthreads", base.nthreads, 1, kMaxThreads, false);
  within("host_nthreads", base.host_nthreads, 1, kMaxThreads, false);
  return base;
}

void SettingsOverride::set(std::string_view name, std::string_view value) {
  for (const Descriptor& d : kTable) {
    if (name == d.name) {
      d.parse(*this, value, d.name);
      return;
    }
  }
  std::string names;
  for (const Descriptor& d : kTable) names += names.empty() ? d.name : fmt::format(", {}", d.name);
  throw SettingError(std::string(name), std::string(value),
                     fmt::format("unknown setting '{}'; known settings: {}", name, names));
}

namespace {
// settings() after a change: apart, so that the common case saves no registers for it.
[[gnu::noinline]] Settings refresh_view(bool base_changed) {
  ThreadScopes& mine = *this_thread_scopes();
  view.scopes = &mine;
  if (base_changed) {
    Global& g = global();
    std::lock_guard lock(g.mu);
    loaded_global();
    throw_env_error(g);
    view.base = g.current;
    view.seen = version.load(std::memory_order_relaxed);
  }
  std::lock_guard lock(mine.mu);
  Settings layered = view.base;
  for (const auto& [id, changes] : mine.layers) layered = changes.apply_to(layered);
  view.effective = layered;
  view.seen_layers = mine.generation.load(std::memory_order_relaxed);
  return view.effective;
}
}  // namespace

Settings settings() {
  // Every request reads the settings: a thread keeps its last copy and takes a lock only after a
  // change (process-wide changes bump the global version, its scopes their own generation).
  const bool base_changed = view.seen != version.load(std::memory_order_acquire);
  if (!base_changed && view.scopes != nullptr &&
      view.seen_layers == view.scopes->generation.load(std::memory_order_acquire)) [[likely]] {
    return view.effective;
  }
  return refresh_view(base_changed);
}

namespace {
// Whether `changes` sets any setting: the table's tests, unrolled at compile time (a loop of
// indirect calls was 84 instructions of every small request's 1,500, bench/NOTES.md).
template <std::size_t... I>
bool sets_any(const SettingsOverride& changes, std::index_sequence<I...>) {
  return (kTable[I].is_set(changes) || ...);
}

// settings_with() of a File that overrides a setting: apart, as refresh_view() is.
[[gnu::noinline]] Settings overridden(const SettingsOverride& changes) {
  try {
    return changes.apply_to(settings());
  } catch (const SettingError&) {
    // Slow path, only while a variable is malformed: ignore the errors `changes` repairs.
  }
  Global& g = global();
  Settings base;
  {
    std::lock_guard lock(g.mu);
    loaded_global();
    for (size_t i = 0; i < kTable.size(); ++i) {
      if (g.env_errors[i] && !kTable[i].is_set(changes)) throw *g.env_errors[i];
    }
    base = g.current;
  }
  ThreadScopes& mine = *this_thread_scopes();
  std::lock_guard lock(mine.mu);
  for (const auto& [id, layer] : mine.layers) base = layer.apply_to(base);
  return changes.apply_to(base);
}
}  // namespace

Settings settings_with(const SettingsOverride& changes) {
  // Most Files override nothing: settings() is already checked (every small request asks,
  // bench/NOTES.md §30).
  if (!sets_any(changes, std::make_index_sequence<kTable.size()>())) [[likely]]
    return settings();
  return overridden(changes);
}

SettingsCheck check_settings() {
  SettingsCheck check;
  Global& g = global();
  {
    std::lock_guard lock(g.mu);
    loaded_global();
    check.settings = g.current;  // defaults where a variable is malformed
    for (const auto& error : g.env_errors) {
      if (error) check.errors.push_back(*error);
    }
  }
  read_below_core(&check.errors);
  ThreadScopes& mine = *this_thread_scopes();
  std::lock_guard lock(mine.mu);
  for (const auto& [id, layer] : mine.layers) check.settings = layer.apply_to(check.settings);
  return check;
}

std::optional<std::string> nearest_name(std::string_view word,
                                        const std::vector<std::string>& names) {
  // Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
  // neighbours ("raed" is one edit from "read").
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
    return d[a.size()][b.size()];
  };
  const std::string w = base::lower(word);
  std::optional<std::string> best;
  std::size_t best_distance = 0;
  for (const std::string& name : names) {
    const std::size_t n = distance(w, base::lower(name));
    if (!best || n < best_distance) {
      best = name;
      best_distance = n;
    }
  }
  // Near enough to be a slip of the fingers: a third of the word, at least one edit, at most 3.
  const std::size_t limit = std::clamp<std::size_t>(w.size() / 3, 1, 3);
  if (!best || best_distance == 0 || best_distance > limit) return std::nullopt;
  return best;
}

void set_settings(const SettingsOverride& changes) {
  Global& g = global();
  std::lock_guard lock(g.mu);
  loaded_global();
  g.current = changes.apply_to(g.current);
  mark_code(g, changes);
  for (size_t i = 0; i < kTable.size(); ++i) {
    if (kTable[i].is_set(changes)) g.env_errors[i].reset();
  }
  version.fetch_add(1, std::memory_order_release);
}

std::vector<SettingInfo> describe_settings() {
  Settings current = check_settings().settings;  // this thread's view: its scopes included
  Global& g = global();
  std::array<SettingSource, kTable.size()> sources;
  std::array<std::string, kTable.size()> source_env;
  std::array<std::string, kTable.size()> errors;
  {
    std::lock_guard lock(g.mu);
    sources = g.sources;
    source_env = g.source_env;
    for (size_t i = 0; i < kTable.size(); ++i) {
      if (g.env_errors[i]) errors[i] = g.env_errors[i]->what();
    }
  }
  {
    ThreadScopes& mine = *this_thread_scopes();
    std::lock_guard lock(mine.mu);
    for (const auto& [id, changes] : mine.layers) {
      for (size_t i = 0; i < kTable.size(); ++i) {
        if (kTable[i].is_set(changes)) sources[i] = SettingSource::kCode;
      }
    }
  }
  std::vector<SettingInfo> rows;
  for (size_t i = 0; i < kTable.size(); ++i) {
    SettingInfo row{kTable[i].name, kTable[i].var.env, kTable[i].print(current), sources[i]};
    if (row.source == SettingSource::kEnvironment) row.source_env = source_env[i];
    row.error = errors[i];
    for (const char* var : kTable[i].var.kvikio) {
      if (var != nullptr) row.kvikio_env.emplace_back(var);
    }
    rows.push_back(std::move(row));
  }
  for (SettingInfo& row : read_below_core()) rows.push_back(std::move(row));
  return rows;
}

// For tests only: declared in tests/test_hooks.h.
void reload_settings_from_environment() {
  Global& g = global();
  std::lock_guard lock(g.mu);
  g.loaded = false;
  g.current = Settings{};
  g.sources = {};
  g.source_env = {};
  g.env_errors = {};
  version.fetch_add(1, std::memory_order_release);
}

struct ScopedSettings::Saved {
  std::shared_ptr<ThreadScopes> owner;
};

ScopedSettings::ScopedSettings(const SettingsOverride& changes) {
  changes.apply_to(settings());  // a bad value throws here, before the scope exists
  saved_ = new Saved{this_thread_scopes()};
  std::lock_guard lock(saved_->owner->mu);
  saved_->owner->layers.emplace_back(saved_, changes);
  saved_->owner->generation.fetch_add(1, std::memory_order_release);
}

ScopedSettings::~ScopedSettings() {
  {
    ThreadScopes& owner = *saved_->owner;
    std::lock_guard lock(owner.mu);
    std::erase_if(owner.layers, [this](const auto& layer) { return layer.first == saved_; });
    owner.generation.fetch_add(1, std::memory_order_release);
  }
  delete saved_;
}

}  // namespace ferry
