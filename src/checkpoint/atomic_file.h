// A file that appears complete under its name or not at all: its bytes go to a temporary file
// beside the destination (.NAME.ferry-PID-XXXXXX, created with O_EXCL), which commit() fsyncs
// (when durable), renames over the destination and follows with an fsync of the folder. Until
// then the destination is untouched; destroying an uncommitted AtomicFile removes the temporary
// file. Temporary files of killed processes are removed by the next AtomicFile for the same name.
// Not thread-safe: one owner.
#pragma once

#include <filesystem>
#include <set>
#include <string>

#include "ferry/file.h"

namespace ferry::checkpoint {

class AtomicFile {
 public:
  // Throws IoError naming `dest` (or its folder) when the temporary file cannot be made, or
  // when `dest` exists and is not a regular file (EISDIR, EINVAL).
  AtomicFile(std::filesystem::path dest, const FileOptions& options);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  File& file() { return file_; }
  const std::filesystem::path& dest() const { return dest_; }
  const std::filesystem::path& temp() const { return temp_; }
  // fsync (when durable) and close the file; the bytes are complete under the temporary name.
  void finish(bool durable);
  // finish(), then rename over the destination and (when durable) fsync the folder.
  void commit(bool durable);
  // Gives the temporary file up to the caller: the destructor no longer removes it.
  void release() { committed_ = true; }

 private:
  std::filesystem::path dest_;
  std::filesystem::path temp_;
  File file_;
  bool finished_ = false;
  bool committed_ = false;
};

// fsync of a folder, so that the renames and unlinks inside it survive a crash.
void sync_folder(const std::filesystem::path& folder);

// Removes `folder`'s temporary files (.NAME.ferry-PID-XXXXXX) whose process is gone, except the
// file names in `keep` (those a checkpoint's index names).
void remove_stale_temps(const std::filesystem::path& folder,
                        const std::set<std::string>& keep = {});

// An IoError from writing `temp` (the temporary file of `dest`) restated to name `dest`.
[[noreturn]] void rethrow_naming(const std::filesystem::path& dest,
                                 const std::filesystem::path& temp);

}  // namespace ferry::checkpoint
