// ferry write: write bytes from GPU or host memory to a file. Also how test and benchmark files
// are made. What it promises (docs/reliability.md, "ferry write"): PATH is either left as it was
// or replaced by the complete new file, also across a crash or a kill at any moment. The data
// goes to a new temporary file beside PATH (a name no other process can hold, created with
// O_EXCL), is written, fsynced and closed with every error checked, takes PATH's permissions, and
// is renamed over PATH; then the folder is fsynced, so the rename itself is durable. A symlink is
// written through (its target is replaced) unless fs.protected_symlinks forbids following it; a
// FIFO, device or folder at PATH is refused, never replaced, and so are a file with other hard
// links and a file the caller could not open for writing. A temporary file left by a killed run is
// removed by the next run for the same PATH.
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/xattr.h>
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

// The kernel's fs.protected_symlinks rule (Documentation/admin-guide/sysctl/fs.rst): a symlink
// in a sticky world-writable folder is followed only when the follower owns the link or the
// folder's owner owns it. ferry write resolves links itself (it renames onto the target), so the
// kernel never gets to apply the rule: ferry applies it, whatever the sysctl says (a link that
// another user planted in /tmp is no safer when the sysctl is off).
void may_follow(const fs::path& link, const struct stat& link_st) {
  const fs::path folder = link.parent_path().empty() ? fs::path(".") : link.parent_path();
  struct stat dir {};
  if (::stat(folder.c_str(), &dir) != 0) throw IoError(errno, "stat", folder.string(), 0, 0);
  if ((dir.st_mode & (S_ISVTX | S_IWOTH)) != (S_ISVTX | S_IWOTH)) return;
  if (link_st.st_uid == ::geteuid() || link_st.st_uid == dir.st_uid) return;
  throw IoError(EACCES, "open", link.string(), 0, 0, 0,
                fmt::format("a symlink owned by uid {} in the sticky world-writable folder {} "
                            "(owned by uid {}): not followed (the kernel's fs.protected_symlinks "
                            "rule; only its owner or the folder's owner may follow it)",
                            link_st.st_uid, folder.string(), dir.st_uid));
}

// PATH with its symlinks followed (PATH itself when it is not one); a loop is an error, and so
// is a link that fs.protected_symlinks forbids following.
fs::path follow_links(const fs::path& path) {
  fs::path p = path;
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    may_follow(p, st);
    std::error_code ec;
    fs::path to = fs::read_symlink(p, ec);
    if (ec) throw IoError(ec.value(), "readlink", p.string(), 0, 0);
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  throw IoError(ELOOP, "open", path.string(), 0, 0, 0, "too many levels of symbolic links");
}

// ferry write replaces only a file that the caller could have opened for writing at PATH (through
// its links, with every check the kernel makes): a rename needs only the folder's permission,
// so without this a user could replace a read-only file, or another user's file, of a folder
// they may write. A file being executed (ETXTBSY) may be replaced: that is what a rename is for.
void check_writable(const std::string& path, const struct stat& target) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ETXTBSY) return;
    throw IoError(err, "open", path, 0, 0, 0,
                  fmt::format("{}; ferry write replaces only a file it could open for writing",
                              std::strerror(err)));
  }
  struct stat st {};
  const bool same =
      ::fstat(fd, &st) == 0 && st.st_dev == target.st_dev && st.st_ino == target.st_ino;
  ::close(fd);
  if (!same) {
    throw IoError(EAGAIN, "open", path, 0, 0, 0,
                  "the file changed while ferry looked at it; run the command again");
  }
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

// PATH's access ACL (the xattr system.posix_acl_access, absent on most files) onto the new file.
void copy_access_acl(const fs::path& from, int to_fd, const std::string& temp) {
  static const char kName[] = "system.posix_acl_access";
  const ssize_t want = ::getxattr(from.c_str(), kName, nullptr, 0);
  if (want < 0) {
    if (errno == ENODATA || errno == ENOTSUP) return;
    throw IoError(
        errno, "getxattr", from.string(), 0, 0, 0,
        fmt::format("{} (reading its ACL, to give it to the new file)", std::strerror(errno)));
  }
  std::string acl(static_cast<std::size_t>(want), '\0');
  const ssize_t got = ::getxattr(from.c_str(), kName, acl.data(), acl.size());
  if (got < 0 || ::fsetxattr(to_fd, kName, acl.data(), static_cast<std::size_t>(got), 0) != 0) {
    const int err = errno;
    throw IoError(err, "fsetxattr", temp, 0, 0, 0,
                  fmt::format("{}: cannot give the new file the ACL of {}; it is unchanged",
                              std::strerror(err), from.string()));
  }
}

// The new file takes the owner (where allowed), the permissions and the access ACL of the one it
// replaces, after its bytes are written (a write by a process without CAP_FSETID clears setuid,
// and chown clears it too, so the bits come last). A setuid or setgid bit is kept only with the
// owner (group) it had: ferry never makes a setuid file of another owner; it says so when it
// drops one.
void take_attributes(int fd, const std::string& temp, const fs::path& dest,
                     const struct stat& old) {
  if (::fchown(fd, old.st_uid, old.st_gid) != 0) {
    // Not ours to give away (EPERM): the new file belongs to whoever wrote it.
  }
  struct stat now {};
  if (::fstat(fd, &now) != 0) throw IoError(errno, "fstat", temp, 0, 0);
  mode_t mode = old.st_mode & 07777;
  std::string dropped;
  if ((mode & S_ISUID) && now.st_uid != old.st_uid) {
    mode &= ~S_ISUID;
    dropped = fmt::format("setuid (uid {})", old.st_uid);
  }
  if ((mode & S_ISGID) && now.st_gid != old.st_gid) {
    mode &= ~S_ISGID;
    dropped += fmt::format("{}setgid (gid {})", dropped.empty() ? "" : " and ", old.st_gid);
  }
  if (::fchmod(fd, mode) != 0) throw IoError(errno, "fchmod", temp, 0, 0);
  copy_access_acl(dest, fd, temp);
  if (!dropped.empty()) {
    fmt::print(stderr,
               "note: {} was {}; the new file belongs to uid {} gid {}, so it is not: ferry write "
               "never gives a setuid or setgid bit to another owner\n",
               dest.string(), dropped, now.st_uid, now.st_gid);
  }
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
  if (a.path.empty()) {
    throw IoError(ENOENT, "write", "\"\"", 0, 0, 0, "empty path: name the file to write");
  }
  if (is_remote_url(a.path)) {
    // A URL (http://, https://, s3://) would otherwise become a local path of that name.
    throw IoError(EROFS, "write", shown_path(a.path), 0, size, 0,
                  "remote objects are read-only in ferry: write to a local path");
  }
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
  if (exists) {
    check_writable(a.path, old);
    if (old.st_nlink > 1) {
      // A rename gives one name a new file; the other names would keep the old bytes.
      throw IoError(EMLINK, "write", a.path, 0, size, 0,
                    fmt::format("{} has {} hard links; replacing it would split them (this "
                                "name on the new bytes, the others on the old): refused (remove "
                                "the other links, or write to another path)",
                                dest.string(), old.st_nlink));
    }
  }
  remove_stale_temps(dest);
  std::string temp =
      (dest.parent_path() / temp_prefix(dest)).string() + fmt::format("{}-XXXXXX", getpid());
  // The signals that remove the temporary file are blocked from before it exists until the
  // handler knows its name: a SIGTERM in between left it behind.
  sigset_t stops, before;
  sigemptyset(&stops);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&stops, sig);
  sigprocmask(SIG_BLOCK, &stops, &before);
  struct sigaction act {};
  act.sa_handler = on_signal;
  sigemptyset(&act.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaction(sig, &act, nullptr);
  const int temp_fd = mkostemp(temp.data(), O_CLOEXEC);
  const int temp_errno = errno;
  if (temp_fd >= 0 && temp.size() < sizeof g_temp) {
    std::memcpy(g_temp, temp.c_str(), temp.size() + 1);
  }
  sigprocmask(SIG_SETMASK, &before, nullptr);
  if (temp_fd < 0) {
    throw IoError(temp_errno, "open", temp, 0, 0, 0,
                  fmt::format("{} (making the temporary file beside {})", std::strerror(temp_errno),
                              dest.string()));
  }
  auto discard = [&] {
    g_temp[0] = 0;
    unlink(temp.c_str());
    close(temp_fd);
  };
  RouteReport route;
  double cpu = 0;
  // The fsyncs after the write request (file, then folder): the request's seconds are the
  // bytes reaching the page cache; durability waits for the disk on top.
  double sync_seconds = 0;
  try {
    // "r+": mkostemp made it empty; "w" would add O_TRUNC, after which ext4 writes the file back
    // at close(2) if a block still awaits delayed allocation (checkpoint/atomic_file.cc).
    FileOptions options = file_options(a.settings);
    options.write_behind = !a.no_sync;  // fsynced once written: its writeback starts as it goes
    File file(temp, "r+", options);
    const double cpu0 = cpu_seconds();
    IoFuture future = file.pwrite(buffer.data(), size, 0);
    wait_with_progress(future, size, "writing");
    future.get();
    // The bytes are written: now the attributes (before the fsync, which makes them durable).
    if (exists) {
      take_attributes(temp_fd, temp, dest, old);
    } else {
      const mode_t mask = umask(0);
      umask(mask);
      if (fchmod(temp_fd, 0666 & ~mask) != 0) throw IoError(errno, "fchmod", temp, 0, 0);
    }
    if (!a.no_sync) {
      const auto synced_at = std::chrono::steady_clock::now();
      file.sync();
      sync_seconds = seconds_since(synced_at);
    }
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
  if (!a.no_sync) {
    const auto synced_at = std::chrono::steady_clock::now();
    sync_folder(dest);
    sync_seconds += seconds_since(synced_at);
  }
  const double durable_seconds = route.seconds + sync_seconds;
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
                          {"sync_seconds", sync_seconds},
                          {"durable_gbps", a.no_sync ? nlohmann::json(nullptr)
                                                     : nlohmann::json(gbps(size, durable_seconds))},
                          {"route", nlohmann::json::parse(route.to_json())}};
    if (!target.note.empty()) out["note"] = target.note;
    if (a.checksum) out["sha256"] = digest;
    fmt::print("{}\n", json_text(out, 2));
    return 0;
  }
  fmt::print("wrote {} B to {} from {} in {:.4f} s: {:.2f} GB/s, {}{}\n", size, a.path,
             to_string(target.kind), route.seconds, gbps(size, route.seconds), cpu_words(cpu, size),
             a.no_sync ? " (not synced)" : "");
  if (!a.no_sync) {
    fmt::print("synced (file and folder) in {:.4f} s more: {:.2f} GB/s durable\n", sync_seconds,
               gbps(size, durable_seconds));
  }
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
