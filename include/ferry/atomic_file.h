// ferry::AtomicFile: a file that appears complete under its name or not at all, the protocol of
// every save (save_file, a checkpoint's shards and index, ferry write). Its bytes go to a locked
// temporary file beside the destination (.NAME.ferry-XXXXXXXXXX); finish() gives it the
// attributes of the file it replaces, fsyncs (when durable) and closes it; commit() renames it
// over the destination and fsyncs the folder. Until then the destination is untouched; an
// AtomicFile destroyed uncommitted removes its temporary file, and one of a killed process is
// removed by a later save in that folder (remove_stale_temps). Not thread-safe: one owner.
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>

#include "ferry/file.h"

namespace ferry {

namespace checkpoint {
class TempFile;
}  // namespace checkpoint

class AtomicFile {
 public:
  // Throws IoError naming `dest`: when it exists and is not a regular file (EISDIR, EINVAL),
  // when the caller could not open it for writing (EACCES for a 0444 file: a rename needs only
  // the folder's permission, so without this check a save would replace a file its writer may
  // not write), or when the temporary file cannot be made (EROFS, ENOSPC, EACCES on the folder).
  AtomicFile(std::filesystem::path dest, const FileOptions& options);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  File& file() { return file_; }
  const std::filesystem::path& dest() const { return dest_; }
  const std::filesystem::path& temp() const { return temp_path_; }
  // The replaced file's owner (where the caller may give it), permissions and access ACL onto
  // the new file, then (when durable) fsync, then close, every error checked. A setuid or setgid
  // bit is kept only with the owner or group it had; note() then says what was dropped.
  void finish(bool durable);
  // finish(), then rename over the destination and (when durable) fsync the folder.
  void commit(bool durable);
  // Gives the temporary file up to the caller (an index names it): the destructor leaves it.
  void release();
  // A sentence for the user when finish() dropped a setuid or setgid bit; empty otherwise.
  const std::string& note() const { return note_; }

 private:
  std::filesystem::path dest_;
  bool replaces_ = false;
  struct stat old_ {};
  std::unique_ptr<checkpoint::TempFile> temp_;
  std::filesystem::path temp_path_;
  File file_;
  std::string note_;
  bool finished_ = false;
  bool committed_ = false;
};

// Throws IoError (EROFS) when `dest` is a URL (http://, https://, s3://): remote objects are
// read-only in ferry, and such a name would otherwise become local folders ("s3:/b/x"). Every
// save (AtomicFile, save_file, save_checkpoint) calls it before touching anything.
void refuse_remote_destination(const std::filesystem::path& dest);

// fsync of a folder, so that the renames and unlinks inside it survive a crash. Throws IoError.
void sync_folder(const std::filesystem::path& folder);

// Removes the temporary files of saves in `folder` whose writer is gone: its lock on the file is
// free (a lock, not a PID: PIDs of other PID namespaces or hosts mean nothing here). Files that
// an index in the folder (*.safetensors.index.json) names are kept. Returns how many it removed.
std::size_t remove_stale_temps(const std::filesystem::path& folder);

}  // namespace ferry
