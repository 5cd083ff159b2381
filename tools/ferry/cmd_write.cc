// ferry write: write bytes from GPU or host memory to a file. Also how test and benchmark files
// are made. What it promises (docs/reliability.md, "ferry write"): PATH is either left as it was
// or replaced by the complete new file, also across a crash or a kill at any moment. The data
// goes through a ferry::AtomicFile: a new temporary file beside PATH (locked by this process while
// it lives), written, fsynced and closed with every error checked, given PATH's owner,
// permissions and ACL, and renamed over PATH; then the folder is fsynced, so the rename itself is
// durable. A symlink is
// written through (its target is replaced) unless fs.protected_symlinks forbids following it; a
// FIFO, device or folder at PATH is refused, never replaced, and so are a file with other hard
// links and a file the caller could not open for writing. A temporary file left by a killed run is
// removed by the next save into that folder (its lock is free).
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
#include "ferry/atomic_file.h"
#include "progress.h"

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

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
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
  const std::uint64_t size = parse_size(a.size, "--size");
  if (a.path.empty()) {
    throw IoError(ENOENT, "write", "\"\"", 0, 0, 0, "empty path: name the file to write");
  }
  const ChosenMemory target = choose_memory_or_throw(a.memory);
  Buffer buffer(target.memory.kind, size, std::max(target.memory.device, 0));
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
    if (old.st_nlink > 1) {
      // A rename gives one name a new file; the other names would keep the old bytes.
      throw IoError(EMLINK, "write", a.path, 0, size, 0,
                    fmt::format("{} has {} hard links; replacing it would split them (this "
                                "name on the new bytes, the others on the old): refused (remove "
                                "the other links, or write to another path)",
                                dest.string(), old.st_nlink));
    }
  }
  remove_stale_temps(dest.parent_path().empty() ? fs::path(".") : dest.parent_path());
  FileOptions options = file_options(a.settings);
  options.write_behind = !a.no_sync;  // fsynced once written: its writeback starts as it goes
  // The signals that remove the temporary file are blocked from before it exists until the
  // handler knows its name: a SIGTERM in between left it behind.
  sigset_t stops, before;
  sigemptyset(&stops);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&stops, sig);
  sigprocmask(SIG_BLOCK, &stops, &before);
  std::unique_ptr<AtomicFile> saved;
  try {
    saved = std::make_unique<AtomicFile>(dest, options);
  } catch (...) {
    sigprocmask(SIG_SETMASK, &before, nullptr);
    throw;
  }
  remove_on_signals(saved->temp().string(), {SIGINT, SIGTERM, SIGHUP, SIGPIPE});
  sigprocmask(SIG_SETMASK, &before, nullptr);
  RouteReport route;
  double cpu = 0;
  // The fsyncs after the write request (file, then folder): the request's seconds are the
  // bytes reaching the page cache; durability waits for the disk on top.
  double sync_seconds = 0;
  try {
    const double cpu0 = cpu_seconds();
    IoFuture future = saved->file().pwrite(buffer.data(), size, 0);
    wait_with_progress(future, size, "writing", progress_wanted(a.json));
    future.get();
    cpu = cpu_seconds() - cpu0;
    route = future.route();
    // The attributes of the file replaced, then (unless --no-sync) the fsyncs of the file and of
    // its folder around the rename: durability's time, reported apart from the write request's.
    const auto synced_at = std::chrono::steady_clock::now();
    saved->commit(!a.no_sync);
    if (!a.no_sync) sync_seconds = seconds_since(synced_at);
  } catch (...) {
    forget_signal_temp();
    throw;  // the AtomicFile removes its temporary file
  }
  forget_signal_temp();
  if (!saved->note().empty()) fmt::print(stderr, "note: {}\n", saved->note());
  const double durable_seconds = route.seconds + sync_seconds;
  const double cpu_per_gib = cpu_seconds_per_gib(cpu, size);
  if (a.json) {
    nlohmann::json out = {{"file", a.path},
                          {"bytes", size},
                          {"seconds", route.seconds},
                          {"gbps", gbps(size, route.seconds)},
                          {"cpu_seconds_per_gib", cpu_per_gib},
                          {"synced", !a.no_sync},
                          {"sync_seconds", sync_seconds},
                          {"durable_gbps", a.no_sync ? nlohmann::json(nullptr)
                                                     : nlohmann::json(gbps(size, durable_seconds))},
                          {"route", nlohmann::json::parse(route.to_json())}};
    out.update(memory_json(target));
    if (a.checksum) out["sha256"] = digest;
    fmt::print("{}\n", json_text(out, 2));
    return 0;
  }
  fmt::print("wrote {} B to {} from {} in {:.4f} s: {:.2f} GB/s, {}{}\n", size, a.path,
             to_string(target.memory.kind), route.seconds, gbps(size, route.seconds),
             cpu_words(cpu, size), a.no_sync ? " (not synced)" : "");
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
  // A URL (http://, https://, s3://) is refused as the command line is read, before any work:
  // taken as a local path, it named a folder "http:" that does not exist. The words are those
  // of ferry.open(url, "w") (remote_seam.cc), with the URL as every output shows it.
  cmd->add_option("path", args->path,
                  "File to create or replace (a symlink's target; never a FIFO or device)")
      ->required()
      ->check(CLI::Validator(
          [](std::string& path) -> std::string {
            if (!is_remote_url(path)) return {};
            return fmt::format(
                "{} is a URL, and remote objects are read-only in ferry (ferry.open refuses "
                "mode \"w\" for one too): write to a local path",
                shown_path(path));
          },
          "PATH"));
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
