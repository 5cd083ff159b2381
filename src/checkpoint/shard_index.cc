#include "checkpoint/shard_index.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "checkpoint/json_scan.h"
#include "ferry/checkpoint.h"
#include "ferry/file.h"
#include "io/io_seam.h"

namespace ferry::checkpoint {

namespace fs = std::filesystem;

namespace {

// What a path that is neither a regular file nor a folder is, in words.
std::string kind_of(fs::file_type type) {
  switch (type) {
    case fs::file_type::fifo:
      return "a FIFO";
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::socket:
      return "a socket";
    default:
      return "of an unknown kind";
  }
}

std::string read_text(const fs::path& path) {
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > kMaxIndexSize) {
    throw CheckpointError(path.string(), "",
                          fmt::format("the index is {} B, above the {} B limit for an index file",
                                      size, kMaxIndexSize));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path.string(), "", "cannot open the index file");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The index's JSON, with duplicate keys refused (nlohmann would keep the last silently; a
// safetensors header refuses them too) and nesting past kMaxIndexDepth refused before it costs
// memory (10 MB of nested arrays took 386 MB).
nlohmann::json parse_json(const std::string& text, const std::string& file) {
  return parse_strict(
      text, kMaxIndexDepth,
      [&](const std::string& key, int depth) {
        throw CheckpointError(file, depth == 2 ? key : "",
                              fmt::format("the index names \"{}\" twice", key));
      },
      [&] {
        throw CheckpointError(file, "",
                              fmt::format("the index nests deeper than {} levels", kMaxIndexDepth));
      },
      [&](const std::string& message) {
        throw CheckpointError(file, "", fmt::format("index is not valid JSON: {}", message));
      });
}

// `shard` (a name from the index, or a file found in the folder) as a path inside `dir`: a
// relative path with no ".." that names a regular file whose real path, symlinks resolved, is
// inside the folder too. A checkpoint cannot make ferry read a file outside its folder.
fs::path shard_inside(const fs::path& dir, const std::string& shard, const std::string& file,
                      const std::string& tensor) {
  const fs::path name(shard);
  if (shard.find('\0') != std::string::npos) {
    throw CheckpointError(file, tensor, "its shard name holds a NUL byte");
  }
  if (name.is_absolute()) {
    throw CheckpointError(file, tensor,
                          fmt::format("its shard {} is an absolute path: shards must be inside "
                                      "the checkpoint's folder",
                                      shard));
  }
  for (const fs::path& part : name) {
    if (part == "..") {
      throw CheckpointError(file, tensor,
                            fmt::format("its shard {} leaves the checkpoint's folder", shard));
    }
  }
  const fs::path p = dir / name;
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  if (!fs::exists(st)) {
    throw CheckpointError(file, tensor, fmt::format("its shard {} does not exist", p.string()));
  }
  if (!fs::is_regular_file(st)) {
    throw CheckpointError(file, tensor,
                          fmt::format("its shard {} is {}, not a regular file", p.string(),
                                      fs::is_directory(st) ? "a directory" : kind_of(st.type())));
  }
  const fs::path real = fs::canonical(p, ec);
  const fs::path real_dir = fs::canonical(dir.empty() ? fs::path(".") : dir, ec);
  if (ec) throw CheckpointError(file, tensor, fmt::format("cannot resolve {}", p.string()));
  // The Hugging Face hub's cache keeps a revision's files in models--ORG--NAME/snapshots/REV/ as
  // links to ../../blobs/SHA256: links that stay inside the repository's folder load, as they do
  // for safetensors and transformers; a link leaving it does not.
  const bool hub_snapshot = real_dir.parent_path().filename() == "snapshots";
  const fs::path root = hub_snapshot ? real_dir.parent_path().parent_path() : real_dir;
  auto [d, r] = std::mismatch(root.begin(), root.end(), real.begin(), real.end());
  if (d != root.end()) {
    throw CheckpointError(
        file, tensor,
        fmt::format("its shard {} is a link to {}, outside the checkpoint's {} {}", p.string(),
                    real.string(), hub_snapshot ? "hub cache folder" : "folder", root.string()));
  }
  return p;
}

// `text` with each %XX replaced by its byte, again until none is left: what a server that
// decodes a request's path (once, or more) reads.
std::string percent_decoded(std::string text) {
  auto hex = [](unsigned char c) { return std::isdigit(c) ? c - '0' : std::tolower(c) - 'a' + 10; };
  for (bool again = true; again;) {
    again = false;
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
      const auto c1 = static_cast<unsigned char>(i + 1 < text.size() ? text[i + 1] : 0);
      const auto c2 = static_cast<unsigned char>(i + 2 < text.size() ? text[i + 2] : 0);
      if (text[i] == '%' && std::isxdigit(c1) && std::isxdigit(c2)) {
        out.push_back(static_cast<char>(hex(c1) * 16 + hex(c2)));
        i += 2;
        again = true;
      } else {
        out.push_back(text[i]);
      }
    }
    text = std::move(out);
  }
  return text;
}

// A shard an index names beside it on a server: a relative name with no "..", no query and no
// scheme, so that an index cannot send ferry to another host or bucket. The name is checked as
// given and as a server reads it, percent-decoded: nginx serves "..%2Fx" as "../x".
fs::path shard_beside(const fs::path& dir, const std::string& shard, const std::string& file,
                      const std::string& tensor) {
  const std::string decoded = percent_decoded(shard);
  if (decoded.find('\0') != std::string::npos) {
    throw CheckpointError(file, tensor, "its shard name holds a NUL byte");
  }
  bool escapes = false;
  for (const std::string& name : {shard, decoded}) {
    escapes = escapes || name.front() == '/' || name.find("://") != std::string::npos ||
              name.find_first_of("?#\\") != std::string::npos;
  }
  bool dotdot = false;
  for (const fs::path& part : fs::path(decoded)) dotdot = dotdot || part == "..";
  if (escapes || dotdot) {
    throw CheckpointError(
        file, tensor,
        fmt::format("its shard {}{} is not a plain name beside the index: "
                    "shards of a remote checkpoint must be under its prefix",
                    shard, decoded == shard ? "" : fmt::format(" ({} decoded)", decoded)));
  }
  return fs::path(dir.string() + "/" + shard);
}

using ShardResolver = fs::path (*)(const fs::path&, const std::string&, const std::string&,
                                   const std::string&);

ShardIndex parse_index_with(const std::string& text, const fs::path& index_file,
                            ShardResolver resolve);

// The text of a remote index, read through ferry's own File (its GETs).
std::string read_remote_text(const std::string& url) {
  File f(url, "r");
  const std::uint64_t size = f.size();
  if (size > kMaxIndexSize) {
    throw CheckpointError(f.path(), "",
                          fmt::format("the index is {} B, above the {} B limit for an index file",
                                      size, kMaxIndexSize));
  }
  std::string text(size, '\0');
  if (size > 0 && f.read(text.data(), size, 0) != size) {
    throw CheckpointError(f.path(), "", "the index ended before its size");
  }
  return text;
}

// A remote checkpoint: an index URL, a .safetensors URL, or a prefix under which
// model.safetensors.index.json or model.safetensors lies (a remote folder is not listed).
ShardIndex discover_remote(const std::string& url) {
  const std::string shown = io::shown_url(url);
  // The kind is told from the path alone: a presigned URL's query follows its ".safetensors".
  const std::string path = io::url_path(url);
  if (path.ends_with(".json")) {
    return parse_index_with(read_remote_text(url), fs::path(url), &shard_beside);
  }
  if (path.ends_with(".safetensors")) {
    ShardIndex single;
    single.shards.push_back(fs::path(url));
    return single;
  }
  if (shown.ends_with("?...")) {
    throw CheckpointError(shown, "",
                          fmt::format("a URL with a query names one file, and its path {} ends "
                                      "in neither .safetensors nor .json: give the .safetensors "
                                      "or .safetensors.index.json URL",
                                      path.empty() ? "/" : path));
  }
  std::string base = url;
  while (!base.empty() && base.back() == '/') base.pop_back();
  const std::string index = base + "/model.safetensors.index.json";
  try {
    return parse_index_with(read_remote_text(index), fs::path(index), &shard_beside);
  } catch (const IoError& e) {
    if (e.error_code() != ENOENT) throw;
  }
  const std::string single_url = base + "/model.safetensors";
  try {
    File probe(single_url, "r");
  } catch (const IoError& e) {
    if (e.error_code() != ENOENT) throw;
    throw CheckpointError(shown, "",
                          "neither model.safetensors.index.json nor model.safetensors exists "
                          "under it (remote folders are not listed: give the index's or the "
                          "file's URL)");
  }
  ShardIndex single;
  single.shards.push_back(fs::path(single_url));
  return single;
}

// A folder without an index whose files say NAME-00002-of-00003.safetensors must hold all three:
// a save or a download stopped half-way leaves some, and loading those would be a model with
// tensors missing, silently.
void require_every_shard(const fs::path& dir, const std::vector<fs::path>& files) {
  static const std::regex kNumbered(R"((.*)-(\d+)-of-(\d+)\.safetensors)");
  std::map<std::pair<std::string, std::string>, std::set<std::string>> found;
  for (const fs::path& f : files) {
    std::smatch m;
    const std::string name = f.filename().string();
    if (std::regex_match(name, m, kNumbered)) found[{m[1], m[3]}].insert(m[2]);
  }
  for (const auto& [key, have] : found) {
    const auto& [prefix, of] = key;
    const std::size_t count = std::strtoull(of.c_str(), nullptr, 10);
    std::vector<std::string> missing;
    for (std::size_t i = 1; i <= count && missing.size() < 4; ++i) {
      const std::string number = fmt::format("{:0{}d}", i, of.size());
      if (have.count(number) == 0) {
        missing.push_back(fmt::format("{}-{}-of-{}.safetensors", prefix, number, of));
      }
    }
    if (!missing.empty() || have.size() != count) {
      throw CheckpointError(
          dir.string(), "",
          fmt::format("the folder holds {} of the {} shards named {}-*-of-{}.safetensors and no "
                      "index (missing: {}{}): a save or a download stopped before its end",
                      have.size(), count, prefix, of, fmt::join(missing, ", "),
                      missing.size() == 4 ? ", ..." : ""));
    }
  }
}

}  // namespace

ShardIndex parse_index(const std::string& text, const fs::path& index_file) {
  return parse_index_with(text, index_file, &shard_inside);
}

namespace {

ShardIndex parse_index_with(const std::string& text, const fs::path& index_file,
                            ShardResolver resolve) {
  const std::string file = io::shown_url(index_file.string());
  nlohmann::json doc = parse_json(text, file);
  if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object()) {
    throw CheckpointError(file, "", "index has no \"weight_map\" object");
  }
  ShardIndex index;
  index.index_file = index_file;
  if (doc.contains("metadata")) {
    if (!doc["metadata"].is_object() && !doc["metadata"].is_null()) {
      throw CheckpointError(file, "", "index \"metadata\" is not an object");
    }
    if (doc["metadata"].is_object()) {
      index.metadata_json =
          doc["metadata"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
  }
  if (doc["weight_map"].empty()) {
    throw CheckpointError(file, "", "index names no tensor: its \"weight_map\" is empty");
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
    auto named =
        std::find_if(names.begin(), names.end(), [&](const auto& n) { return n.second == shard; });
    index.shards.push_back(resolve(dir, shard, file, named->first));
  }
  auto& map = index.weight_map.emplace();
  for (const auto& [tensor, shard] : names) {
    map.emplace(tensor, std::lower_bound(files.begin(), files.end(), shard) - files.begin());
  }
  return index;
}

}  // namespace

ShardIndex discover_shards(const fs::path& path) {
  if (io::is_remote_url(path.string())) return discover_remote(path.string());
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_regular_file(st)) {
    if (path.filename().string().ends_with(".json")) return parse_index(read_text(path), path);
    ShardIndex single;
    single.shards.push_back(path);
    return single;
  }
  if (!fs::exists(st)) {
    throw CheckpointError(path.string(), "",
                          ec && ec != std::errc::no_such_file_or_directory
                              ? fmt::format("cannot stat it: {}", ec.message())
                              : std::string("no such file or directory"));
  }
  if (!fs::is_directory(st)) {
    // A FIFO would block the first read until a writer came, /dev/zero never end.
    throw CheckpointError(path.string(), "",
                          fmt::format("it is {}, not a regular file or a folder: a checkpoint "
                                      "is a .safetensors file, an index or a folder of them",
                                      kind_of(st.type())));
  }
  std::vector<fs::path> indexes;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file()) continue;
    if (name.ends_with(".safetensors.index.json")) indexes.push_back(e.path());
    if (name.ends_with(".safetensors")) {
      files.push_back(shard_inside(path, name, path.string(), ""));
    }
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
  require_every_shard(path, files);
  ShardIndex dir;
  dir.shards = std::move(files);
  return dir;
}

}  // namespace ferry::checkpoint
