#include "ferry/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "checkpoint/temp_file.h"
#include "ferry/error.h"
#include "ferry/remote.h"

namespace ferry {

namespace fs = std::filesystem;
using checkpoint::folder_of;

namespace {

// A save replaces only a file that the caller could have opened for writing: a rename needs only
// the folder's permission, so without this a save would replace a read-only file, or another
// user's. A file being executed (ETXTBSY) may be replaced: that is what a rename is for.
void check_writable(const fs::path& dest, const struct stat& old) {
  const int fd = ::open(dest.c_str(), O_WRONLY | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ETXTBSY) return;
    throw IoError(err, "open", dest.string(), 0, 0, 0,
                  fmt::format("{} (mode {:04o}, owner uid {}); a save replaces only a file its "
                              "writer could open for writing, and {} is unchanged",
                              std::strerror(err), old.st_mode & 07777, old.st_uid, dest.string()));
  }
  struct stat st {};
  const bool same = ::fstat(fd, &st) == 0 && st.st_dev == old.st_dev && st.st_ino == old.st_ino;
  ::close(fd);
  if (!same) {
    throw IoError(EAGAIN, "open", dest.string(), 0, 0, 0,
                  "the file changed while ferry looked at it; save again");
  }
}

// The replaced file's access ACL (the xattr system.posix_acl_access, absent on most files).
void copy_access_acl(const fs::path& from, int to_fd, const fs::path& temp) {
  static const char kName[] = "system.posix_acl_access";
  const ssize_t want = ::getxattr(from.c_str(), kName, nullptr, 0);
  if (want < 0) {
    if (errno == ENODATA || errno == ENOTSUP || errno == ENOENT) return;
    throw IoError(
        errno, "getxattr", from.string(), 0, 0, 0,
        fmt::format("{} (reading its ACL, to give it to the new file)", std::strerror(errno)));
  }
  std::string acl(static_cast<std::size_t>(want), '\0');
  const ssize_t got = ::getxattr(from.c_str(), kName, acl.data(), acl.size());
  if (got < 0 || ::fsetxattr(to_fd, kName, acl.data(), static_cast<std::size_t>(got), 0) != 0) {
    const int err = errno;
    throw IoError(err, "fsetxattr", temp.string(), 0, 0, 0,
                  fmt::format("{}: cannot give the new file the ACL of {}; it is unchanged",
                              std::strerror(err), from.string()));
  }
}

}  // namespace

void refuse_remote_destination(const fs::path& dest) {
  // Before this check "s3://b/x" was a local path: a save made the folders s3:/b/x and reported
  // success.
  if (is_remote_url(dest.native())) {
    throw IoError(EROFS, "save", shown_path(dest.native()), 0, 0, 0,
                  "remote objects are read-only in ferry: save to a local path (and upload it "
                  "with your object store's tools); nothing was written");
  }
}

AtomicFile::AtomicFile(fs::path dest, const FileOptions& options) : dest_(std::move(dest)) {
  refuse_remote_destination(dest_);
  if (dest_.filename().empty()) {
    throw IoError(EINVAL, "save", dest_.empty() ? "\"\"" : dest_.string(), 0, 0, 0,
                  dest_.empty() ? "empty path: name the file to write"
                                : "no file name (the path ends in a folder): name the file to "
                                  "write");
  }
  replaces_ = ::stat(dest_.c_str(), &old_) == 0;
  if (!replaces_ && errno != ENOENT) throw IoError(errno, "stat", dest_.string(), 0, 0);
  if (replaces_ && !S_ISREG(old_.st_mode)) {
    throw IoError(S_ISDIR(old_.st_mode) ? EISDIR : EINVAL, "save", dest_.string(), 0, 0, 0,
                  "not a regular file; a save replaces regular files only");
  }
  if (replaces_) check_writable(dest_, old_);
  temp_ = std::make_unique<checkpoint::TempFile>(dest_);
  temp_path_ = temp_->path();
  try {
    // "r+", not "w": the file was just made empty, and O_TRUNC on an existing file tells ext4 to
    // write the file back at close(2) (auto_da_alloc) whenever a block of it is still waiting for
    // delayed allocation (the header's, which the data's allocation ahead does not cover). A
    // save of 64 tensors, whose header passes 4 KiB, then ran at the disk's speed without an
    // fsync: 1.4 against 4.1 GB/s on an H200 (bench/NOTES.md §26).
    file_ = File(temp_path_, "r+", options);
  } catch (const IoError&) {
    ::unlink(temp_path_.c_str());
    checkpoint::rethrow_naming(dest_, temp_path_);
  }
}

AtomicFile::~AtomicFile() {
  if (committed_) return;
  try {
    file_.close();
  } catch (...) {
    // The file is being discarded; its close error no longer matters.
  }
  ::unlink(temp_path_.c_str());
}

void AtomicFile::release() { committed_ = true; }

void AtomicFile::finish(bool durable) {
  if (finished_) return;
  const int fd = temp_->fd();
  try {
    // After the bytes: a write by a process without CAP_FSETID clears setuid, and so does chown.
    if (replaces_) {
      if (::fchown(fd, old_.st_uid, old_.st_gid) != 0) {
        // Not ours to give away (EPERM): the new file belongs to whoever wrote it.
      }
      struct stat now {};
      if (::fstat(fd, &now) != 0) throw IoError(errno, "fstat", temp_path_.string(), 0, 0);
      mode_t mode = old_.st_mode & 07777;
      std::string dropped;
      if ((mode & S_ISUID) && now.st_uid != old_.st_uid) {
        mode &= ~S_ISUID;
        dropped = fmt::format("setuid (uid {})", old_.st_uid);
      }
      if ((mode & S_ISGID) && now.st_gid != old_.st_gid) {
        mode &= ~S_ISGID;
        dropped += fmt::format("{}setgid (gid {})", dropped.empty() ? "" : " and ", old_.st_gid);
      }
      if (::fchmod(fd, mode) != 0) throw IoError(errno, "fchmod", temp_path_.string(), 0, 0);
      copy_access_acl(dest_, fd, temp_path_);
      if (!dropped.empty()) {
        note_ = fmt::format(
            "{} was {}; the new file belongs to uid {} gid {}, so it is not: ferry never gives a "
            "setuid or setgid bit to another owner",
            dest_.string(), dropped, now.st_uid, now.st_gid);
      }
    }
    if (durable) file_.sync();
    file_.close();  // a write lost at close(2) fails here, before the rename
  } catch (const IoError&) {
    checkpoint::rethrow_naming(dest_, temp_path_);
  }
  finished_ = true;
}

void AtomicFile::commit(bool durable) {
  finish(durable);
  struct stat made {
  }, named{};
  if (::fstat(temp_->fd(), &made) != 0 || ::stat(temp_path_.c_str(), &named) != 0 ||
      made.st_ino != named.st_ino || made.st_dev != named.st_dev) {
    throw IoError(EEXIST, "save", dest_.string(), 0, 0, 0,
                  fmt::format("its temporary file {} was replaced or removed while ferry wrote "
                              "it; {} is unchanged",
                              temp_path_.string(), dest_.string()));
  }
  if (::rename(temp_path_.c_str(), dest_.c_str()) != 0) {
    const int err = errno;
    throw IoError(err, "rename", dest_.string(), 0, 0, 0,
                  fmt::format("{}; the new file is removed and {} is unchanged", std::strerror(err),
                              dest_.string()));
  }
  committed_ = true;
  temp_->close();
  if (durable) sync_folder(folder_of(dest_));
}

void sync_folder(const fs::path& folder) {
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw IoError(err, "open", folder.string(), 0, 0, 0,
                  fmt::format("{} (to fsync the renames in it)", std::strerror(err)));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    throw IoError(err, "fsync", folder.string(), 0, 0, 0,
                  fmt::format("{}; its renames may not survive a crash", std::strerror(err)));
  }
}

namespace checkpoint {

void rethrow_naming(const fs::path& dest, const fs::path& temp) {
  try {
    throw;
  } catch (const IoError& e) {
    throw IoError(e.error_code(), e.op(), dest.string(), e.offset(), e.length(), e.bytes_done(),
                  fmt::format("{} (in its temporary file {}, which is removed; {} is unchanged)",
                              std::strerror(e.error_code()), temp.string(), dest.string()));
  }
}

}  // namespace checkpoint

}  // namespace ferry
