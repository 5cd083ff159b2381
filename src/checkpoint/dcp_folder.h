// A torch.distributed.checkpoint (DCP) folder read for inference, without torch or a process
// group: `.metadata` (dcp_metadata.h) lists each tensor's chunks; each chunk becomes byte ranges
// (pieces) of its `.distcp` file placed into the full, contiguous tensor. Byte items (pickled
// non-tensor values) are listed, not loaded. Pure functions, except open_dcp_folder; results are
// immutable.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/dcp_metadata.h"
#include "checkpoint/torch_save_blob.h"
#include "ferry/checkpoint.h"

namespace ferry::checkpoint {

// `length` bytes at `file_offset` of shard `shard` land at byte `dest` of the whole tensor.
struct TensorPiece {
  std::size_t shard = 0;
  std::uint64_t file_offset = 0;
  std::uint64_t length = 0;
  std::uint64_t dest = 0;
};

// The pieces that put `record` (chunk `chunk` of `tensor`, its blob in shard `shard`) into the
// whole tensor, contiguous runs merged. Throws CheckpointError naming `file` and the tensor.
std::vector<TensorPiece> place_chunk(const DcpTensorMeta& tensor, const DcpChunk& chunk,
                                     const TorchTensorRecord& record, std::size_t shard,
                                     const std::string& file);

struct DcpFolder {
  std::vector<std::string> shard_names;  // the .distcp files' paths
  std::vector<std::unique_ptr<File>> files;
  std::vector<TensorInfo> tensors;  // file_offset: its first piece's; shard: its first piece's
  std::vector<std::vector<TensorPiece>> pieces;  // per tensor, in dest order
  std::vector<std::string> byte_items;
  // What opening read: .metadata, then each file's blob heads and tails (BlobRegions).
  std::uint64_t open_reads = 0;
  std::uint64_t open_bytes = 0;
};
// Reads `.metadata` and every chunk's blob headers, a file's headers in one read per region
// (BlobRegions), and places each chunk's bytes. Reads no tensor data beyond the blobs' heads.
DcpFolder open_dcp_folder(const std::filesystem::path& dir, const FileOptions& options);

// Byte ranges [first, second) of a file.
using ByteRanges = std::vector<std::pair<std::uint64_t, std::uint64_t>>;
// The regions of a file that opening reads, each with one read: `wanted` (each blob's head and
// tail) sorted and merged where they overlap or lie within `max_gap` of each other, a region
// growing no larger than `max_region` unless one range alone is.
ByteRanges merge_regions(ByteRanges wanted, std::uint64_t max_gap, std::uint64_t max_region);

}  // namespace ferry::checkpoint
