// ferry write: write bytes from GPU or host memory to a file. Also how test and benchmark files
// are made. What it promises (docs/reliability.md, "ferry write"): PATH is either left as it was
// or replaced by the complete new file, also across a crash or a kill at any moment. The data
// goes to a new temporary file beside PATH (a name no other process can hold, created with
// O_EXCL), is written, fsynced and closed with every error checked, takes PATH's permissions, and
// is renamed over PATH; then the folder is fsynced, so the rename itself is durable. A symlink is
// written through (its target is replaced); a FIFO, device or folder at PATH is refused, never
// replaced. A temporary file left by a killed run is removed by the next run for the same PATH.
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"

namespace ferry::cli {
namespace {

namespace fs = std::filesystem;

// PATH with its symlinks followed (PATH itself when it is not one); a loop is an error.
fs::path follow_links(const fs::path& path) {
  fs::path p = path;
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec))) return p;
    fs::path to = fs::read_symlink(p, ec);
    if (ec) throw IoError(ec.value(), "readlink", p.string(), 0, 0);
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  throw IoError(ELOOP, "open", path.string(), 0, 0, 0, "too many levels of symbolic links");
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string temp_prefix(const fs::path& target) {
  return "." + target.filename().string() + ".ferry-";
}

// Temporary files of earlier runs for the same target whose process is gone (killed, crashed).
void remove_stale_temps(const fs::path& target) {
  const std::string prefix = temp_prefix(target);
  const fs::path folder = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  DIR* d = opendir(folder.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    // .NAME.ferry-PID-XXXXXX
    const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
    if (pid > 0 && pid != getpid() && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      unlinkat(dirfd(d), name.c_str(), 0);
    }
  }
  closedir(d);
}

// The temporary file's name, for the signal handler (async-signal-safe unlink only).
char g_temp[4096];

void on_signal(int sig) {
  if (g_temp[0] != 0) unlink(g_temp);
  signal(sig, SIG_DFL);
  raise(sig);
}

void sync_folder(const fs::path& target) {
  const fs::path folder = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  int fd = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw IoError(err, "open", folder.string(), 0, 0, 0,
                  fmt::format("{} (to fsync the rename)", std::strerror(err)));
  }
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) {
    throw IoError(err, "fsync", folder.string(), 0, 0, 0,
                  fmt::format("{}; the rename may not survive a crash", std::strerror(err)));
  }
}

struct WriteArgs {
  std::string path;
  std::string size;
  MemoryChoice memory;
  SettingsFlags settings;
  std::string pattern = "random";
  std::uint64_t seed = 1;
  bool no_sync = false;
  bool checksum = false;
  bool json = false;
};

int run(const WriteArgs& a) {
  const std::uint64_t size = size_option(a.size, "--size");
  const Target target = resolve_target(a.memory);
  Buffer buffer(target.kind, size, std::max(target.device, 0));
  fill_pattern(buffer, a.pattern, a.seed);
  const std::string digest = a.checksum ? sha256(buffer, size) : "";

  // What is at PATH decides what may happen to it.
  const fs::path dest = follow_links(fs::path(a.path));
  struct stat old {};
  const bool exists = ::stat(dest.c_str(), &old) == 0;
  if (!exists && errno != ENOENT) throw IoError(errno, "stat", dest.string(), 0, 0);
  if (exists && !S_ISREG(old.st_mode)) {
    throw IoError(EINVAL, "write", a.path, 0, size, 0,
                  fmt::format("{} is {}; ferry write replaces regular files only (remove it "
                              "first, or write to another path)",
                              dest.string(), kind_of(old.st_mode)));
  }
  remove_stale_temps(dest);
  std::string temp =
      (dest.parent_path() / temp_prefix(dest)).string() + fmt::format("{}-XXXXXX", getpid());
  const int temp_fd = mkostemp(temp.data(), O_CLOEXEC);
  if (temp_fd < 0) throw IoError(errno, "open", temp, 0, 0, 0, "temporary file beside the dest");
  if (temp.size() < sizeof g_temp) std::memcpy(g_temp, temp.c_str(), temp.size() + 1);
  struct sigaction act {};
  act.sa_handler = on_signal;
  sigemptyset(&act.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaction(sig, &act, nullptr);
  auto discard = [&] {
    g_temp[0] = 0;
    unlink(temp.c_str());
    close(temp_fd);
  };
  RouteReport route;
  double cpu = 0;
  try {
    // The new file takes the permissions (and, where allowed, the owner) of the one it replaces.
    mode_t mode = 0;
    if (exists) {
      mode = old.st_mode & 07777;
      if (fchown(temp_fd, old.st_uid, old.st_gid) != 0) {
        // Not ours to give away (EPERM): the new file belongs to whoever wrote it.
      }
    } else {
      const mode_t mask = umask(0);
      umask(mask);
      mode = 0666 & ~mask;
    }
    if (fchmod(temp_fd, mode) != 0) throw IoError(errno, "fchmod", temp, 0, 0);
    File file(temp, "w", file_options(a.settings));
    const double cpu0 = cpu_seconds();
    IoFuture future = file.pwrite(buffer.data(), size, 0);
    wait_with_progress(future, size, "writing");
    future.get();
    if (!a.no_sync) file.sync();
    cpu = cpu_seconds() - cpu0;
    route = future.route();
    file.close();  // a write lost at close(2) fails here, before the rename
    struct stat made {
    }, named{};
    if (fstat(temp_fd, &made) != 0 || ::stat(temp.c_str(), &named) != 0 ||
        made.st_ino != named.st_ino || made.st_dev != named.st_dev) {
      throw IoError(EEXIST, "write", temp, 0, size, 0,
                    "the temporary file was replaced while ferry wrote it");
    }
    if (::rename(temp.c_str(), dest.c_str()) != 0) {
      const int err = errno;  // before the cleanup can change it
      throw IoError(err, "rename", dest.string(), 0, size, 0,
                    fmt::format("{}; the new file is removed and {} is unchanged",
                                std::strerror(err), dest.string()));
    }
  } catch (...) {
    discard();
    throw;
  }
  g_temp[0] = 0;
  close(temp_fd);
  if (!a.no_sync) sync_folder(dest);
  const double cpu_per_gib = size > 0 ? cpu / (static_cast<double>(size) / (1 << 30)) : 0;
  if (a.json) {
    nlohmann::json out = {{"file", a.path},
                          {"bytes", size},
                          {"seconds", route.seconds},
                          {"gbps", gbps(size, route.seconds)},
                          {"cpu_seconds_per_gib", cpu_per_gib},
                          {"memory", is_gpu(target.kind) ? "gpu" : "host"},
                          {"memory_kind", to_string(target.kind)},
                          {"device", target.device},
                          {"synced", !a.no_sync},
                          {"route", nlohmann::json::parse(route.to_json())}};
    if (!target.note.empty()) out["note"] = target.note;
    if (a.checksum) out["sha256"] = digest;
    fmt::print("{}\n", json_text(out, 2));
    return 0;
  }
  fmt::print("wrote {} B to {} from {} in {:.4f} s: {:.2f} GB/s, {}{}\n", size, a.path,
             to_string(target.kind), route.seconds, gbps(size, route.seconds), cpu_words(cpu, size),
             a.no_sync ? " (not synced)" : "");
  if (!target.note.empty()) fmt::print("note: {}\n", target.note);
  fmt::print("{}", route.to_text());
  if (a.checksum) fmt::print("sha256: {}\n", digest);
  return 0;
}

}  // namespace

void add_write_command(CLI::App& app, std::function<int()>& action) {
  auto args = std::make_shared<WriteArgs>();
  CLI::App* cmd = app.add_subcommand("write", "Write bytes from GPU or host memory to a file");
  cmd->add_option("path", args->path,
                  "File to create or replace (a symlink's target; never a FIFO or device)")
      ->required();
  cmd->add_option("--size", args->size, "Bytes to write, e.g. 1GiB")->required();
  add_memory_options(*cmd, args->memory);
  add_settings_options(*cmd, args->settings);
  cmd->add_option("--pattern", args->pattern, "random (deterministic from --seed) or zero")
      ->check(CLI::IsMember({"random", "zero"}));
  cmd->add_option("--seed", args->seed, "Seed of the random pattern");
  cmd->add_flag("--no-sync", args->no_sync,
                "Skip the fsyncs of the file and of its folder (faster; not durable across a "
                "crash)");
  cmd->add_flag("--checksum", args->checksum, "Print the SHA-256 of the bytes written");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &action] { action = [args] { return run(*args); }; });
}

}  // namespace ferry::cli
