// Where a torch.save blob keeps one tensor's bytes: the blob is a zip (entries stored, not
// compressed) of `<archive>/data.pkl`, which names the tensor's storage, offset, size and stride,
// and `<archive>/data/<key>`, the storage's raw bytes. Only what locates those bytes is read:
// the end-of-central-directory record (zip64 too), the central directory, two local headers and
// data.pkl. Reads go through the caller's function; no state is kept, so calls are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ferry::checkpoint {

struct TorchTensorRecord {
  std::string storage_class;         // "torch.FloatStorage", "torch.storage.UntypedStorage"...
  std::uint64_t data_offset = 0;     // of the storage's bytes, in the file
  std::uint64_t data_length = 0;     // the storage's bytes
  std::uint64_t storage_offset = 0;  // in elements, where the tensor starts in its storage
  std::vector<std::uint64_t> size;
  std::vector<std::uint64_t> stride;  // in elements
};

// `read(offset, length)` returns exactly those bytes of `file` (or throws). The blob is
// [blob_offset, blob_offset + blob_length) of the file. Throws CheckpointError naming the file
// and the offset at fault.
using ReadAt = std::function<std::string(std::uint64_t offset, std::uint64_t length)>;
// The reads a blob takes, in its bytes: its last kTorchSaveTailBytes (the end records and, in
// every blob torch writes, the central directory), then its local headers and data.pkl, which
// lie in its first few hundred bytes. A caller that has those two regions read need read nothing.
inline constexpr std::uint64_t kTorchSaveTailBytes = 1024;
TorchTensorRecord read_torch_save_tensor(const ReadAt& read, std::uint64_t blob_offset,
                                         std::uint64_t blob_length, const std::string& file);

// One entry of a torch.save blob: its name ("archive/data/0") and where its bytes lie in the file.
struct TorchSaveEntry {
  std::string name;
  std::uint64_t data_offset = 0;
  std::uint64_t length = 0;
};

// Every entry of the blob (a whole torch.save file for ferry.torch.load), refused as
// read_torch_save_tensor refuses a blob: no data.pkl, an entry compressed or past the end.
std::vector<TorchSaveEntry> read_torch_save_entries(const ReadAt& read, std::uint64_t blob_offset,
                                                    std::uint64_t blob_length,
                                                    const std::string& file);

// The classes a torch.save data.pkl of one tensor may name.
bool torch_save_class_allowed(std::string_view name);

}  // namespace ferry::checkpoint
