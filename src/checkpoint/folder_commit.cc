// The pieces of the folder commit protocol (folder_commit.h). The order of a save that uses them:
// make_folders, FolderLock, the data files under names no live checkpoint uses (each fsynced, the
// folder fsynced), write_commit_file (the commit point), then removal of what the new commit file
// does not name.
#include "checkpoint/folder_commit.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <vector>

#include "checkpoint/progress_meter.h"
#include "checkpoint/temp_file.h"
#include "ferry/atomic_file.h"
#include "ferry/error.h"
#include "ferry/memory.h"

namespace ferry::checkpoint {

namespace fs = std::filesystem;

void make_folders(const fs::path& dir, bool durable) {
  std::vector<fs::path> made;
  for (fs::path p = dir; !p.empty(); p = p.parent_path()) {
    std::error_code ec;
    if (fs::exists(p, ec)) break;
    made.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = made.rbegin(); it != made.rend(); ++it) {
    if (::mkdir(it->c_str(), 0777) != 0 && errno != EEXIST) {
      const int err = errno;
      throw IoError(
          err, "mkdir", it->string(), 0, 0, 0,
          fmt::format("{} (making the checkpoint's folder {})", std::strerror(err), dir.string()));
    }
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw IoError(ENOTDIR, "save", dir.string(), 0, 0, 0,
                  "not a folder; a checkpoint is saved into a folder");
  }
  if (!durable) return;
  for (const fs::path& p : made) sync_folder(folder_of(p));
}

namespace {

[[noreturn]] void lock_failed(int err, const fs::path& dir) {
  throw IoError(
      err, "flock", dir.string(), 0, 0, 0,
      fmt::format("{} (locking the folder against a second save into it)", std::strerror(err)));
}

}  // namespace

FolderLock::FolderLock(const fs::path& dir, Mode mode) : mode_(mode) {
  fd_ = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd_ < 0) lock_failed(errno, dir);
  bool held = lock();
  int err = errno;
  if (!held && (err == EBADF || err == ENOLCK || err == EOPNOTSUPP || err == EINVAL)) {
    ::close(fd_);
    fd_ = ::open((dir / ".ferry-save.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) lock_failed(errno, dir);
    held = lock();
    err = errno;
  }
  if (held) return;
  ::close(fd_);
  if (err == EWOULDBLOCK) {
    throw IoError(EBUSY, "flock", dir.string(), 0, 0, 0,
                  "another save into this folder is in progress (it holds the folder's save "
                  "lock); a second writer is refused. Wait for it to finish, or save elsewhere");
  }
  lock_failed(err, dir);
}

FolderLock::~FolderLock() { ::close(fd_); }

bool FolderLock::lock() {
  const int how = mode_ == Mode::kRefuse ? LOCK_EX | LOCK_NB : LOCK_EX;
  while (::flock(fd_, how) != 0) {
    if (errno != EINTR) return false;
  }
  return true;
}

void write_commit_file(const fs::path& path, std::string_view text, const FileOptions& options,
                       bool durable, bool& renamed) {
  renamed = false;
  AtomicFile out(path, options);
  try {
    out.file().write(text.data(), text.size(), 0);
  } catch (const IoError&) {
    rethrow_naming(path, out.temp());
  }
  out.finish(durable);
  out.commit(false);
  renamed = true;
  if (durable) sync_folder(path.parent_path());
}

void rethrow_after_commit(const fs::path& dir, const std::string& how) {
  try {
    throw;
  } catch (const IoError& e) {
    throw IoError(e.error_code(), e.op(), e.path(), e.offset(), e.length(), e.bytes_done(),
                  fmt::format("{}; the new checkpoint is already committed in {} ({}), so a "
                              "load gives the new tensors; nothing of it was removed",
                              std::strerror(e.error_code()), dir.string(), how));
  }
}

FileOptions save_file_options(const SaveOptions& options) {
  FileOptions f = options.file;
  f.write_behind = f.write_behind || options.durable;
  return f;
}

void add_write(WriteGroups& groups, std::uint64_t offset, const void* data, std::uint64_t n) {
  if (n == 0) return;
  const MemoryInfo m = classify_memory(data);
  groups[{static_cast<int>(m.kind), m.device}].push_back(
      {offset, static_cast<std::size_t>(n), data});
}

void wait_all(std::vector<IoFuture>& requests, ProgressMeter* meter,
              std::vector<RouteReport>* routes, std::exception_ptr failed) {
  const auto moved = [&requests] {
    std::uint64_t n = 0;
    for (const IoFuture& r : requests) n += r.progress();
    return n;
  };
  std::exception_ptr first;
  for (IoFuture& r : requests) {
    try {
      if (meter != nullptr) meter->wait(r, moved);
      r.get();
      if (routes != nullptr) routes->push_back(r.route());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  if (first) std::rethrow_exception(first);
}

void write_groups(AtomicFile& out, const WriteGroups& groups, ProgressMeter* meter,
                  std::vector<RouteReport>* routes) {
  std::vector<IoFuture> requests;
  std::exception_ptr failed;
  try {
    for (const auto& [kind, ranges] : groups) requests.push_back(out.file().pwrite_scatter(ranges));
  } catch (...) {
    failed = std::current_exception();
  }
  try {
    wait_all(requests, meter, routes, failed);
  } catch (const IoError&) {
    rethrow_naming(out.dest(), out.temp());
  }
}

}  // namespace ferry::checkpoint
