// The safetensors header, read strictly: the 8-byte little-endian length, then a JSON object of
// name -> {dtype, shape, data_offsets} with an optional "__metadata__" of strings, then the data.
// Pure functions over bytes (no I/O), so tests and the fuzz target feed them anything. Every
// failure is a CheckpointError naming the file and, where one is at fault, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/checkpoint.h"

namespace ferry::checkpoint {

// safetensors itself refuses headers above 100 MB; a longer length field is a corrupt file.
inline constexpr std::uint64_t kMaxHeaderSize = 100'000'000;
inline constexpr std::uint64_t kLengthFieldSize = 8;

struct HeaderTensor {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  // data_offsets, relative to the start of the data section
  std::uint64_t end = 0;
};

struct SafetensorsHeader {
  std::uint64_t header_size = 0;      // the JSON's length in bytes
  std::uint64_t data_start = 0;       // 8 + header_size
  std::vector<HeaderTensor> tensors;  // in the order of their bytes in the file
  std::map<std::string, std::string> metadata;
};

// The header length from the first 8 bytes of a file of `file_size` bytes: within the file and
// at most kMaxHeaderSize.
std::uint64_t header_length(std::string_view first8, std::uint64_t file_size,
                            const std::string& file);

// Parses and validates `json` (the header_length bytes after the length field): well-formed,
// known dtypes, shape x dtype size = byte range, ranges inside the data section covering it
// without holes or overlaps, no duplicate names or fields.
SafetensorsHeader parse_header(std::string_view json, std::uint64_t file_size,
                               const std::string& file);

// Both steps over the first bytes of a file (at least 8 + header length of them).
SafetensorsHeader parse_file_prefix(std::string_view prefix, std::uint64_t file_size,
                                    const std::string& file);

}  // namespace ferry::checkpoint
