// Which files make up a checkpoint: one .safetensors file, a *.safetensors.index.json
// (transformers' weight_map of tensor name -> shard file), or a directory holding either. Pure
// discovery over the file system; the shards' headers are checked by the loader.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ferry::checkpoint {

struct ShardIndex {
  std::vector<std::filesystem::path> shards;  // sorted by name
  // From an index: tensor name -> index into `shards`. Absent for a file or a bare directory.
  std::optional<std::map<std::string, std::size_t>> weight_map;
  std::filesystem::path index_file;  // empty without an index
  std::string metadata_json = "{}";  // the index's "metadata" object
};

// The index's JSON text, already read, of the file at `index_file`.
ShardIndex parse_index(const std::string& text, const std::filesystem::path& index_file);

// Throws CheckpointError when `path` is none of the three forms, or names no shard.
ShardIndex discover_shards(const std::filesystem::path& path);

}  // namespace ferry::checkpoint
