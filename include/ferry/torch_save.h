// The files torch.save writes (a zip of data.pkl and one record per storage), for ferry.torch:
// save_torch_file writes one crash-safe with each storage's bytes going through ferry's write path
// from the memory they live in; open_torch_file reads one's data.pkl through the restricted
// unpickler and locates its storages; read_torch_storages reads them into host or GPU memory.
// The functions are thread-safe; the memory they write from or read into is the caller's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "ferry/checkpoint.h"
#include "ferry/checkpoint_writer.h"
#include "ferry/file.h"
#include "ferry/pickle_value.h"

namespace ferry {

// One storage to save as record data/<key>: `nbytes` at `data` (host or GPU memory).
struct TorchStorageSource {
  std::string key;
  const void* data = nullptr;
  std::uint64_t nbytes = 0;
};

// Writes the zip of `data_pkl` (the pickle naming the storages by key, as torch.save's
// persistent ids do) and `storages` to `file`, each storage of at least `alignment` bytes
// starting at a multiple of it (a power of two from 64 to 32768; smaller ones at 64, torch's
// own), so that it can go by O_DIRECT or cuFile. The file appears whole under its name or not at
// all (an AtomicFile: fsynced with its folder when `options.durable`); on failure it is left as it
// was and the error (IoError, CheckpointError) names it. The report counts storages as tensors.
SaveReport save_torch_file(std::string_view data_pkl, std::span<const TorchStorageSource> storages,
                           const std::filesystem::path& file, std::uint64_t alignment = 4096,
                           const SaveOptions& options = {});

struct TorchStorageRecord {
  std::uint64_t offset = 0;  // of its bytes, in the file
  std::uint64_t nbytes = 0;
};

struct TorchFile {
  PickleRef root;                                      // data.pkl's value
  std::map<std::string, TorchStorageRecord> storages;  // data/<key>, by key
};

// The contents of the torch.save file `file`: data.pkl unpickled, only the classes that
// torch.load(weights_only=True) loads a state dict with allowed (tensors, parameters, typed
// storages, OrderedDict, torch.Size), and the storages' places. Throws CheckpointError naming the
// file and the offset at fault: a legacy (non-zip) torch.save file, a truncated file, a zip
// without data.pkl, a refused class.
TorchFile open_torch_file(const std::filesystem::path& file);

// Reads each range of `file` into its buffer (host or GPU memory), one gathered request per kind
// of memory. The report has the bytes, the seconds and a route report per request.
LoadReport read_torch_storages(const std::filesystem::path& file, std::span<const ReadRange> ranges,
                               const FileOptions& options = {});

}  // namespace ferry
