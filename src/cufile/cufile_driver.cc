#include "cufile/cufile_driver.h"

#include <fmt/format.h>
#include <pthread.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>

#include "cufile/cufile_stats.h"

namespace ferry::cufile {
namespace {

struct State {
  std::mutex mu;
  bool open = false;
  bool compat_refused = false;
  bool attempted = false;
  std::optional<std::string> strict_failure;
  std::optional<std::string> lenient_failure;
  int error = 0;
  std::atomic<bool> closed{false};
  bool forked_after_open = false;  // this process is a fork() child of one that opened it
};

State& state() {
  // Process-wide: cuFile has one driver per process. Leaked: the exit handler below may run after
  // static dtors.
  static State* s = [] {
    auto* made = new State();
    // cuFile's driver state does not survive fork(): a child of a process that opened it must
    // not use the copy (and a thread of the parent may hold the lock). `s` is null only in a
    // child forked while it was being made, before any open.
    pthread_atfork(nullptr, nullptr, [] {
      if (s == nullptr) return;
      new (&s->mu) std::mutex;
      if (s->open) {
        s->open = false;
        s->forked_after_open = true;
      }
    });
    return made;
  }();
  return *s;
}

void close_at_exit() {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!s.open) return;
  // A request still running on the (leaked) thread pool would call into a closed driver; leave
  // the library's own teardown to the end of the process instead.
  if (calls_in_flight().load() > 0) return;
  s.closed.store(true);
  s.open = false;
  load().library->DriverClose();
}

std::string open_failure(const abi::Error& e, bool strict, const std::filesystem::path& root) {
  std::string text =
      fmt::format("cuFileDriverOpen{} failed: {}",
                  strict ? " with compatibility mode refused (require=gds)" : "", describe(e));
  std::string nvfs = nvfs_module_missing(root);
  if (!nvfs.empty() && (strict || e.err == abi::kDriverNotInitialized)) text += ": " + nvfs;
  return text;
}

}  // namespace

std::atomic<long>& calls_in_flight() {
  // Process-wide, as the driver it keeps open is; outside State so that a call counts with no
  // guard check.
  static std::atomic<long> calls{0};
  return calls;
}

bool driver_closed() { return state().closed.load(); }

std::string nvfs_module_missing(const std::filesystem::path& root) {
  std::error_code ec;
  if (std::filesystem::exists(root / "proc/driver/nvidia-fs", ec)) return {};
  return "the nvidia-fs kernel module is not loaded (/proc/driver/nvidia-fs is absent)";
}

DriverResult open_driver(bool refuse_compat, const std::filesystem::path& root) {
  const LoadResult& loaded = load();
  if (loaded.library == nullptr) return {nullptr, loaded.why_not, false};
  const Library& lib = *loaded.library;
  State& s = state();
  std::lock_guard lock(s.mu);
  if (s.closed.load()) return {nullptr, "the cuFile driver was closed at exit", false};
  if (s.forked_after_open) {
    return {nullptr,
            "the cuFile driver was opened in the parent process before fork(), and cuFile "
            "cannot be used in a forked child",
            false};
  }
  if (s.open) return {&lib, {}, s.compat_refused};
  std::optional<std::string>& failure = refuse_compat ? s.strict_failure : s.lenient_failure;
  if (failure) return {nullptr, *failure, false};
  s.attempted = true;
  if (refuse_compat) {
    if (lib.SetParameterBool == nullptr) {
      failure = fmt::format(
          "{} lacks cuFileSetParameterBool: cannot refuse cuFile's compatibility mode "
          "(require=gds)",
          lib.path);
      return {nullptr, *failure, false};
    }
    abi::Error e = lib.SetParameterBool(abi::kParamAllowCompatMode, false);
    if (e.err != abi::kSuccess) {
      failure =
          fmt::format("cuFileSetParameterBool(ALLOW_COMPAT_MODE, false) failed: {}", describe(e));
      return {nullptr, *failure, false};
    }
  }
  abi::Error e = lib.DriverOpen();
  if (e.err != abi::kSuccess) {
    s.error = e.err;
    failure = open_failure(e, refuse_compat, root);
    // Let a later lenient caller open the driver the usual way.
    if (refuse_compat) lib.SetParameterBool(abi::kParamAllowCompatMode, true);
    return {nullptr, *failure, false};
  }
  s.open = true;
  s.compat_refused = refuse_compat;
  s.error = 0;
  // Registered after cuFileDriverOpen, so it runs before the handlers libcufile registered
  // while opening (exit runs them in reverse order).
  static bool registered = (std::atexit(close_at_exit), true);  // once per process
  (void)registered;
  start_stats(lib);
  return {&lib, {}, s.compat_refused};
}

int version(std::string* why_not) {
  const LoadResult& loaded = load();
  if (loaded.library == nullptr) {
    if (why_not) *why_not = loaded.why_not;
    return 0;
  }
  if (loaded.library->GetVersion == nullptr) {
    if (why_not) *why_not = fmt::format("{} lacks cuFileGetVersion", loaded.path);
    return 0;
  }
  // Process-wide: the loaded library's version, asked once.
  static const std::pair<int, std::string> cached = [&] {
    int v = 0;
    abi::Error e = loaded.library->GetVersion(&v);
    if (e.err != abi::kSuccess)
      return std::pair<int, std::string>{0, "cuFileGetVersion failed: " + describe(e)};
    return std::pair<int, std::string>{v, {}};
  }();
  if (why_not) *why_not = cached.second;
  return cached.first;
}

DriverState driver_state() {
  State& s = state();
  std::lock_guard lock(s.mu);
  DriverState out;
  out.attempted = s.attempted;
  out.open = s.open;
  out.compat_refused = s.compat_refused;
  out.error = s.error;
  if (s.lenient_failure) {
    out.error_text = *s.lenient_failure;
  } else if (s.strict_failure) {
    out.error_text = *s.strict_failure;
  }
  return out;
}

}  // namespace ferry::cufile
