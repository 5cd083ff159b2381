// Writing torch.distributed.checkpoint (DCP) folders that stock DCP loads, crash-safe with the
// commit protocol of ferry's safetensors folders (docs/training.md): each rank writes its items
// into .distcp files under names unique to the save (write_dcp_file), fsynced with their folder;
// the coordinator, holding the folder's DcpSaveLock from before any rank writes, commits by one
// rename of .metadata (commit_dcp_metadata). Functions are thread-safe; a lock has one owner.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/checkpoint_writer.h"

namespace ferry {

namespace checkpoint {
class FolderLock;
}  // namespace checkpoint

// One item of a rank's save: a tensor (contiguous bytes in host or GPU memory, `tensor.name` its
// flattened name for errors), written as a torch.save blob; or, with `is_bytes`, `bytes` as is.
struct DcpWriteItem {
  TensorSource tensor;
  bool is_bytes = false;
  std::string bytes;
};

// Where an item landed in its file: DCP's _StorageInfo(relative_path, offset, length).
struct DcpItemPlace {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

// Writes `items`, in order, into `file` (a name no committed .metadata uses: the save's own),
// tensors' bytes through ferry's write path from the memory they live in, each starting at a
// multiple of 4096 of the file (64 for tensors under 4096 B). The file appears whole under its
// name or not at all (an AtomicFile), fsynced with its folder when `options.durable`;
// `options.progress` is called as the bytes go. Throws IoError or CheckpointError naming `file`
// (and the item); nothing else in the folder changes. `report`, when given, gets the file, its
// bytes, the tensors, the fsyncs, the seconds and a route report per gathered request.
std::vector<DcpItemPlace> write_dcp_file(std::span<const DcpWriteItem> items,
                                         const std::filesystem::path& file,
                                         const SaveOptions& options = {},
                                         SaveReport* report = nullptr);

// The save lock of a DCP folder, taken by the coordinator before any rank writes and held until
// its commit: makes the folder (durably when `durable`), refuses at once (IoError EBUSY) when
// another save into it holds the lock, then removes the temporary files of killed saves.
class DcpSaveLock {
 public:
  DcpSaveLock(const std::filesystem::path& dir, bool durable);
  ~DcpSaveLock();
  DcpSaveLock(const DcpSaveLock&) = delete;
  DcpSaveLock& operator=(const DcpSaveLock&) = delete;

 private:
  std::unique_ptr<checkpoint::FolderLock> lock_;
};

// The commit: `metadata` (the pickled Metadata naming only `files`) written as `dir`/.metadata
// through a temporary file, fsynced, renamed over the old one (the commit point), the folder
// fsynced; then every *.distcp file in `dir` that `files` does not name is removed. A failure
// before the rename leaves the old checkpoint as it was; one after it says the new checkpoint is
// committed. Call with the folder's DcpSaveLock held, after every rank's write_dcp_file returned.
// `report`, when given, gets .metadata (the commit point), its bytes, the fsyncs and the seconds.
void commit_dcp_metadata(const std::filesystem::path& dir, std::string_view metadata,
                         std::span<const std::string> files, const SaveOptions& options = {},
                         SaveReport* report = nullptr);

}  // namespace ferry
