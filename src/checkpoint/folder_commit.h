// The commit protocol of ferry's checkpoint folders (safetensors shards with their index, DCP's
// .distcp files with their .metadata): the folder made durably, a lock against a second writer,
// the one file whose rename is the commit point, and errors after that point restated. Shared by
// save_checkpoint and the DCP writer (docs/checkpoints.md "Saving", docs/training.md). A
// FolderLock has one owner; the functions are thread-safe.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "ferry/file.h"

namespace ferry::checkpoint {

// mkdir -p, and (when durable) an fsync of the parent of every folder it made: a new folder's
// name is an entry in its parent, lost in a crash unless the parent is synced. Throws IoError
// naming the folder that could not be made, or ENOTDIR when `dir` is not a folder.
void make_folders(const std::filesystem::path& dir, bool durable);

// A folder's save lock, held for a whole save: flock on the folder itself, which leaves no file
// behind; NFS emulates flock with POSIX locks, which a folder opened read-only cannot take, so
// there a lock file inside the folder (.ferry-save.lock, kept) takes its place. kWait: a second
// save, from this process or another, waits for the first; kRefuse: it fails at once with
// IoError EBUSY saying so (DCP's ranks are one save; another job's writer must not join it).
class FolderLock {
 public:
  enum class Mode { kWait, kRefuse };
  FolderLock(const std::filesystem::path& dir, Mode mode);
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  bool lock();
  int fd_ = -1;
  Mode mode_;
};

// Writes `text` to `path` through an AtomicFile (temporary name, fsync when durable, rename, then
// the folder's fsync): the commit point of a folder. `renamed` tells a failure before the rename
// (the old file stands; false) from one after it (the folder's fsync; true).
void write_commit_file(const std::filesystem::path& path, std::string_view text,
                       const FileOptions& options, bool durable, bool& renamed);

// Rethrows the IoError in flight restated for a failure after the commit point: the folder holds
// the new checkpoint, whatever failed afterwards (so no caller may read "unchanged" into it).
// `how` says what failed. Call only from a catch block of IoError.
[[noreturn]] void rethrow_after_commit(const std::filesystem::path& dir, const std::string& how);

}  // namespace ferry::checkpoint
