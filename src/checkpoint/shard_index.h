// Which files make up a checkpoint: one .safetensors file, a *.safetensors.index.json
// (transformers' weight_map of tensor name -> shard file), or a directory holding either. Pure
// discovery over the file system; the shards' headers are checked by the loader.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ferry::checkpoint {

// An index larger or deeper than these is refused before it costs memory: transformers' indexes
// of the largest models are a few MB and three levels deep.
inline constexpr std::uintmax_t kMaxIndexSize = 64u << 20;
inline constexpr int kMaxIndexDepth = 16;

struct ShardIndex {
  std::vector<std::filesystem::path> shards;  // sorted by name
  // From an index: tensor name -> index into `shards`. Absent for a file or a bare directory.
  std::optional<std::map<std::string, std::size_t>> weight_map;
  std::filesystem::path index_file;  // empty without an index
  std::string metadata_json = "{}";  // the index's "metadata" object
};

// The index's JSON text, already read, of the file at `index_file`.
ShardIndex parse_index(const std::string& text, const std::filesystem::path& index_file);

// Throws CheckpointError when `path` is none of the three forms, or names no shard, or names a
// shard outside its folder (an absolute path, "..", or a symlink that resolves out of it).
ShardIndex discover_shards(const std::filesystem::path& path);

}  // namespace ferry::checkpoint
