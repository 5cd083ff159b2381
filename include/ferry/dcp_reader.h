// Reading the items of a torch.distributed.checkpoint (DCP) load plan into memory the caller
// allocated: what ferry.dcp.FileSystemReader.read_data asks of C++. Each item is a region of one
// saved chunk (a torch.save blob in a .distcp file); its bytes go from the file straight into the
// destination, host or GPU memory, through ferry's gathered reads, as `ferry load DIR` reads a
// DCP folder. Thread-safe; no state is kept between calls.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "ferry/checkpoint.h"
#include "ferry/file.h"

namespace ferry {

// One tensor item of a DCP load plan (torch's ReadItem with its _StorageInfo).
struct DcpReadItem {
  std::string name;               // the tensor's flattened name, for errors
  std::string relative_path;      // the chunk's .distcp file, in the folder
  std::uint64_t blob_offset = 0;  // the chunk's torch.save blob in that file
  std::uint64_t blob_length = 0;
  Dtype dtype = Dtype::kU8;            // the saved tensor's, as .metadata lists it
  std::vector<std::uint64_t> offsets;  // the region's start in the chunk (storage_offsets)
  std::vector<std::uint64_t> lengths;  // the region's extent, per dimension
  void* buffer = nullptr;  // the region's elements, row-major and contiguous: host or GPU memory
};

// Reads every item's region of the folder `dir` into its buffer. Each file's blob headers are
// read a region at a time (the report's open_reads and open_bytes), then every file's bytes by
// one gathered request per kind of memory, all files' requests in flight together. Throws
// CheckpointError naming the file and the tensor (a file missing or outside the folder, a blob
// passing the file's end, a region outside its chunk, a blob of another dtype than `dtype`) before
// any tensor byte is read; an IoError of a read after the other requests have ended.
LoadReport read_dcp_items(const std::filesystem::path& dir, std::span<const DcpReadItem> items,
                          const FileOptions& options = {});

}  // namespace ferry
