// A torch.distributed.checkpoint (DCP) folder read for inference, without torch or a process
// group: `.metadata` (a pickle, read by the restricted unpickler with an allow-list of the
// classes DCP writes) lists each tensor's chunks and where each chunk's torch.save blob lies in
// a `.distcp` file; each chunk becomes byte ranges (pieces) of its file placed into the full,
// contiguous tensor. Byte items (pickled non-tensor values) are listed, not loaded.
// Pure functions over bytes, except open_dcp_folder; results are immutable.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

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

struct DcpChunk {
  std::vector<std::uint64_t> offsets;  // where it sits in the whole tensor
  std::vector<std::uint64_t> sizes;
  std::string relative_path;  // its .distcp file, in the folder
  std::uint64_t offset = 0;   // its torch.save blob in that file
  std::uint64_t length = 0;
};

struct DcpTensorMeta {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<std::uint64_t> shape;
  std::vector<DcpChunk> chunks;
};

struct DcpMetadata {
  std::vector<DcpTensorMeta> tensors;  // in .metadata's order
  std::vector<std::string> byte_items;
};

// Whether `path` is a folder holding a `.metadata` file.
bool is_dcp_folder(const std::filesystem::path& path);
// Reads `.metadata`'s bytes; `file` names it in errors.
DcpMetadata parse_dcp_metadata(std::string_view bytes, const std::string& file);
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
};
DcpFolder open_dcp_folder(const std::filesystem::path& dir, const FileOptions& options);

}  // namespace ferry::checkpoint
