#include "checkpoint/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ferry/error.h"

namespace ferry::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMarker = ".ferry-";

fs::path folder_of(const fs::path& p) {
  return p.parent_path().empty() ? fs::path(".") : p.parent_path();
}

// Makes the temporary file with O_EXCL and the mode the destination has (or would get).
fs::path make_temp(const fs::path& dest) {
  struct stat old {};
  const bool exists = ::stat(dest.c_str(), &old) == 0;
  if (!exists && errno != ENOENT) throw IoError(errno, "stat", dest.string(), 0, 0);
  if (exists && !S_ISREG(old.st_mode)) {
    throw IoError(S_ISDIR(old.st_mode) ? EISDIR : EINVAL, "save", dest.string(), 0, 0, 0,
                  "not a regular file; a checkpoint replaces regular files only");
  }
  std::string temp = (folder_of(dest) / ("." + dest.filename().string())).string() +
                     fmt::format("{}{}-XXXXXX", kMarker, getpid());
  const int fd = mkostemp(temp.data(), O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw IoError(err, "open", dest.string(), 0, 0, 0,
                  fmt::format("{} (creating its temporary file in {})", std::strerror(err),
                              folder_of(dest).string()));
  }
  mode_t mode = 0;
  if (exists) {
    mode = old.st_mode & 07777;
  } else {
    const mode_t mask = umask(0);
    umask(mask);
    mode = 0666 & ~mask;
  }
  const int rc = fchmod(fd, mode);
  const int err = errno;
  close(fd);
  if (rc != 0) {
    unlink(temp.c_str());
    throw IoError(err, "fchmod", dest.string(), 0, 0);
  }
  return temp;
}

}  // namespace

AtomicFile::AtomicFile(fs::path dest, const FileOptions& options)
    : dest_(std::move(dest)), temp_(make_temp(dest_)) {
  try {
    // "r+", not "w": the file was just made empty, and O_TRUNC on an existing file tells ext4 to
    // write the file back at close(2) (auto_da_alloc) whenever a block of it is still waiting for
    // delayed allocation (the header's, which the data's allocation ahead does not cover). A
    // save of 64 tensors, whose header passes 4 KiB, then ran at the disk's speed without an
    // fsync: 1.4 against 4.1 GB/s on an H200 (bench/NOTES.md §26).
    file_ = File(temp_, "r+", options);
  } catch (const IoError&) {
    unlink(temp_.c_str());
    rethrow_naming(dest_, temp_);
  }
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  try {
    file_.close();
  } catch (...) {
    // The file is being discarded; its close error no longer matters.
  }
  unlink(temp_.c_str());
}

void AtomicFile::finish(bool durable) {
  if (finished_) return;
  try {
    if (durable) file_.sync();
    file_.close();  // a write lost at close(2) fails here, before the rename
  } catch (const IoError&) {
    rethrow_naming(dest_, temp_);
  }
  finished_ = true;
}

void AtomicFile::commit(bool durable) {
  finish(durable);
  if (::rename(temp_.c_str(), dest_.c_str()) != 0) {
    const int err = errno;
    throw IoError(err, "rename", dest_.string(), 0, 0, 0,
                  fmt::format("{}; the new file is removed and {} is unchanged", std::strerror(err),
                              dest_.string()));
  }
  committed_ = true;
  if (durable) sync_folder(folder_of(dest_));
}

void sync_folder(const fs::path& folder) {
  const int fd = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw IoError(err, "open", folder.string(), 0, 0, 0,
                  fmt::format("{} (to fsync the renames in it)", std::strerror(err)));
  }
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) {
    throw IoError(err, "fsync", folder.string(), 0, 0, 0,
                  fmt::format("{}; its renames may not survive a crash", std::strerror(err)));
  }
}

void remove_stale_temps(const fs::path& folder, const std::set<std::string>& keep) {
  DIR* d = opendir(folder.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    const std::size_t at = name.rfind(kMarker);
    if (name.empty() || name[0] != '.' || at == std::string::npos || keep.count(name)) continue;
    // .NAME.ferry-PID-XXXXXX
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + at + kMarker.size(), &end, 10);
    if (end == nullptr || *end != '-' || std::strlen(end) != 7) continue;
    if (pid > 0 && pid != getpid() && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      unlinkat(dirfd(d), name.c_str(), 0);
    }
  }
  closedir(d);
}

void rethrow_naming(const fs::path& dest, const fs::path& temp) {
  try {
    throw;
  } catch (const IoError& e) {
    throw IoError(e.error_code(), e.op(), dest.string(), e.offset(), e.length(), e.bytes_done(),
                  fmt::format("{} (in its temporary file {}, which is removed; {} is unchanged)",
                              std::strerror(e.error_code()), temp.string(), dest.string()));
  }
}

}  // namespace ferry::checkpoint
