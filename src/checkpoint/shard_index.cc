#include "checkpoint/shard_index.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "ferry/checkpoint.h"

namespace ferry::checkpoint {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path.string(), "", "cannot open the index file");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

ShardIndex parse_index(const std::string& text, const fs::path& index_file) {
  const std::string file = index_file.string();
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(file, "", fmt::format("index is not valid JSON: {}", e.what()));
  }
  if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object()) {
    throw CheckpointError(file, "", "index has no \"weight_map\" object");
  }
  ShardIndex index;
  index.index_file = index_file;
  if (doc.contains("metadata")) {
    if (!doc["metadata"].is_object() && !doc["metadata"].is_null()) {
      throw CheckpointError(file, "", "index \"metadata\" is not an object");
    }
    if (doc["metadata"].is_object()) index.metadata_json = doc["metadata"].dump();
  }
  std::map<std::string, std::string> names;  // tensor -> shard file name
  for (const auto& [tensor, shard] : doc["weight_map"].items()) {
    if (!shard.is_string() || shard.get_ref<const std::string&>().empty()) {
      throw CheckpointError(file, tensor, "weight_map entry is not a shard file name");
    }
    names.emplace(tensor, shard.get<std::string>());
  }
  std::vector<std::string> files;
  for (const auto& [_, shard] : names) files.push_back(shard);
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  const fs::path dir = index_file.parent_path();
  for (const std::string& shard : files) {
    fs::path p = fs::path(shard).is_absolute() ? fs::path(shard) : dir / shard;
    if (!fs::is_regular_file(p)) {
      auto named = std::find_if(names.begin(), names.end(),
                                [&](const auto& n) { return n.second == shard; });
      throw CheckpointError(file, named->first,
                            fmt::format("its shard {} does not exist", p.string()));
    }
    index.shards.push_back(p);
  }
  auto& map = index.weight_map.emplace();
  for (const auto& [tensor, shard] : names) {
    map.emplace(tensor, std::lower_bound(files.begin(), files.end(), shard) - files.begin());
  }
  return index;
}

ShardIndex discover_shards(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    if (ends_with(path.filename().string(), ".json")) return parse_index(read_text(path), path);
    ShardIndex single;
    single.shards.push_back(path);
    return single;
  }
  if (!fs::is_directory(path, ec)) {
    throw CheckpointError(path.string(), "", "no such file or directory");
  }
  std::vector<fs::path> indexes;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file()) continue;
    if (ends_with(name, ".safetensors.index.json")) indexes.push_back(e.path());
    if (ends_with(name, ".safetensors")) files.push_back(e.path());
  }
  std::sort(indexes.begin(), indexes.end());
  std::sort(files.begin(), files.end());
  // transformers writes model.safetensors.index.json; another index beside it (an adapter's)
  // would be a guess, so only that name wins over several.
  auto preferred = std::find_if(indexes.begin(), indexes.end(), [](const fs::path& p) {
    return p.filename() == "model.safetensors.index.json";
  });
  if (preferred != indexes.end()) return parse_index(read_text(*preferred), *preferred);
  if (indexes.size() == 1) return parse_index(read_text(indexes[0]), indexes[0]);
  if (indexes.size() > 1) {
    throw CheckpointError(path.string(), "",
                          fmt::format("{} index files and none is model.safetensors.index.json: "
                                      "name the one to load",
                                      indexes.size()));
  }
  if (files.empty()) {
    throw CheckpointError(path.string(), "", "the directory holds no .safetensors file");
  }
  ShardIndex dir;
  dir.shards = std::move(files);
  return dir;
}

}  // namespace ferry::checkpoint
