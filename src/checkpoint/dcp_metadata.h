// DCP's `.metadata` parsed: the tensors a torch.distributed.checkpoint (DCP) folder holds, their
// chunks, and where each chunk's torch.save blob lies in a `.distcp` file; byte items (pickled
// non-tensor values) by name. Read by the restricted unpickler with an allow-list of the classes
// DCP writes. Pure functions; results are immutable.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/checkpoint.h"

namespace ferry::checkpoint {

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

}  // namespace ferry::checkpoint
