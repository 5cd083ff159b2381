// The commit protocol of ferry's checkpoint folders (safetensors shards with their index, DCP's
// .distcp files with their .metadata): the folder made durably, a lock against a second writer,
// the one file whose rename is the commit point, and errors after that point restated; and the
// writes of one file of a save. Shared by save_checkpoint, the DCP writer and ferry.torch.save
// (docs/checkpoints.md "Saving", docs/training.md). A FolderLock has one owner; the functions are
// thread-safe, each on objects of its caller's.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/checkpoint_writer.h"
#include "ferry/file.h"

namespace ferry {
class AtomicFile;
}  // namespace ferry

namespace ferry::checkpoint {

class ProgressMeter;

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

// The options of a save's files: a durable save's are fsynced once written, so their writes
// start their writeback as they go (FileOptions::write_behind).
FileOptions save_file_options(const SaveOptions& options);

// The pieces of one file's save, grouped by kind of memory and device: a scattered write's buffers
// must be of one kind.
using WriteGroups = std::map<std::pair<int, int>, std::vector<WriteRange>>;

// Adds `n` bytes from `data` at `offset` to its group; an empty piece is left out.
void add_write(WriteGroups& groups, std::uint64_t offset, const void* data, std::uint64_t n);

// Waits for every one of `requests`, also after a failure (they use the caller's memory): through
// `meter` (the bytes moved so far) when given, each route appended to `routes` when given. Then
// rethrows the first failure, or `failed` (a failure to submit more) when given.
void wait_all(std::vector<IoFuture>& requests, ProgressMeter* meter,
              std::vector<RouteReport>* routes, std::exception_ptr failed = nullptr);

// Writes `groups` to `out`'s file, one pwrite_scatter each, and waits for every request, also after
// a failure (they read the caller's memory): through `meter` (the bytes written so far) when given,
// each route appended to `routes` when given. Then rethrows the first failure, an IoError restated
// to name out.dest() rather than its temporary file.
void write_groups(AtomicFile& out, const WriteGroups& groups, ProgressMeter* meter,
                  std::vector<RouteReport>* routes);

}  // namespace ferry::checkpoint
