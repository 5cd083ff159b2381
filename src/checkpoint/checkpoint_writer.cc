// save_file and save_checkpoint: the header from host memory and the tensors by one scattered
// write per kind of memory (GPU tensors staged through the POSIX backend's pinned staging buffers
// by its writer that copies ahead), each file through an AtomicFile. The directory protocol that
// keeps the old checkpoint whole until the new index lands is in docs/checkpoints.md ("Saving").
#include "ferry/checkpoint_writer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "checkpoint/atomic_file.h"
#include "ferry/memory.h"

namespace ferry {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kIndexName = "model.safetensors.index.json";

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The options of a save's files: a durable save's are fsynced once written, so their writes
// start their writeback as they go (FileOptions::write_behind).
FileOptions file_options(const SaveOptions& options) {
  FileOptions f = options.file;
  f.write_behind = f.write_behind || options.durable;
  return f;
}

// One shard on its way: its tensors, layout and the requests writing them.
struct ShardWrite {
  std::vector<TensorSource> tensors;
  SafetensorsLayout layout;
  std::unique_ptr<checkpoint::AtomicFile> out;
  std::vector<IoFuture> requests;
};

// Submits the header (host memory, one write) and the tensors (one scattered write per kind of
// memory and device they live in; empty tensors have no bytes to write).
void submit(ShardWrite& s) {
  File& f = s.out->file();
  try {
    s.requests.push_back(f.pwrite(s.layout.header.data(), s.layout.header.size(), 0));
    std::map<std::pair<int, int>, std::vector<WriteRange>> groups;
    for (std::size_t i : s.layout.order) {
      const TensorSource& t = s.tensors[i];
      if (t.nbytes == 0) continue;
      const MemoryInfo m = classify_memory(t.data);
      groups[{static_cast<int>(m.kind), m.device}].push_back(
          {s.layout.offset[i], static_cast<std::size_t>(t.nbytes), t.data});
    }
    for (const auto& [kind, ranges] : groups) s.requests.push_back(f.pwrite_scatter(ranges));
  } catch (const IoError&) {
    checkpoint::rethrow_naming(s.out->dest(), s.out->temp());
  }
}

// Waits for every request of `s` (all of them, also after a failure), then fsyncs and closes.
void complete(ShardWrite& s, bool durable, SaveReport& report) {
  std::exception_ptr failed;
  for (std::size_t i = 0; i < s.requests.size(); ++i) {
    IoFuture& r = s.requests[i];
    try {
      r.get();
      // The header's write is reported only when there is nothing else to report.
      if (i > 0 || s.requests.size() == 1) report.routes.push_back(r.route());
    } catch (const IoError&) {
      if (!failed) {
        try {
          checkpoint::rethrow_naming(s.out->dest(), s.out->temp());
        } catch (...) {
          failed = std::current_exception();
        }
      }
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  s.requests.clear();
  if (failed) std::rethrow_exception(failed);
  s.out->finish(durable);
  report.bytes += s.layout.file_size;
  report.tensors += s.tensors.size();
}

std::set<std::string> index_shard_names(const fs::path& index) {
  std::set<std::string> names;
  std::ifstream in(index);
  if (!in) return names;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) return names;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (file.is_string()) names.insert(file.get<std::string>());
  }
  return names;
}

std::string index_json(const std::vector<ShardWrite>& shards,
                       const std::vector<std::string>& file_names) {
  nlohmann::json map = nlohmann::json::object();
  std::uint64_t total = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    for (const TensorSource& t : shards[s].tensors) {
      map[t.name] = file_names[s];
      total += t.nbytes;
    }
  }
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  return index.dump(2) + "\n";
}

// Writes `text` to `dir`/`name` through an AtomicFile.
void write_small(const fs::path& path, const std::string& text, const SaveOptions& options) {
  checkpoint::AtomicFile out(path, file_options(options));
  try {
    out.file().write(text.data(), text.size(), 0);
  } catch (const IoError&) {
    checkpoint::rethrow_naming(path, out.temp());
  }
  out.commit(options.durable);
}

// Replaces `dest` with a second name of `temp`, keeping `temp` (a file an index may name).
void link_over(const fs::path& temp, const fs::path& dest, std::size_t n) {
  const fs::path aux =
      dest.parent_path() /
      fmt::format(".{}.ferry-{}-L{:05d}", dest.filename().string(), getpid(), n % 100000);
  ::unlink(aux.c_str());
  if (::link(temp.c_str(), aux.c_str()) != 0) {
    const int err = errno;
    throw IoError(
        err, "link", dest.string(), 0, 0, 0,
        fmt::format("{} (naming {} as {})", std::strerror(err), temp.string(), aux.string()));
  }
  if (::rename(aux.c_str(), dest.c_str()) != 0) {
    const int err = errno;
    ::unlink(aux.c_str());
    throw IoError(err, "rename", dest.string(), 0, 0, 0, std::strerror(err));
  }
}

}  // namespace

std::string SaveReport::summary() const {
  return fmt::format("{} tensors, {} B in {} file(s) in {:.4f} s: {:.2f} GB/s, {} request(s)",
                     tensors, bytes, files.size(), seconds,
                     seconds > 0 ? bytes / seconds / 1e9 : 0.0, routes.size());
}

SaveReport save_file(std::span<const TensorSource> tensors, const fs::path& file,
                     const SaveOptions& options) {
  const auto t0 = Clock::now();
  SaveReport report;
  ShardWrite s;
  s.tensors.assign(tensors.begin(), tensors.end());
  s.layout = safetensors_layout(s.tensors, options.metadata, file.string());
  checkpoint::remove_stale_temps(file.parent_path().empty() ? fs::path(".") : file.parent_path());
  s.out = std::make_unique<checkpoint::AtomicFile>(file, file_options(options));
  submit(s);
  complete(s, options.durable, report);
  s.out->commit(options.durable);
  report.files.push_back(file.string());
  report.seconds = since(t0);
  return report;
}

std::string shard_file_name(std::size_t index, std::size_t count) {
  if (count == 1) return "model.safetensors";
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

std::vector<std::size_t> assign_shards(std::span<const TensorSource> tensors,
                                       std::uint64_t max_shard_size) {
  std::vector<std::size_t> shard(tensors.size(), 0);
  std::size_t current = 0;
  std::uint64_t filled = 0;
  bool empty = true;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t n = tensors[i].nbytes;
    if (max_shard_size > 0 && !empty && filled + n > max_shard_size) {
      ++current;
      filled = 0;
    }
    shard[i] = current;
    filled += n;
    empty = false;
  }
  return shard;
}

SaveReport save_checkpoint(std::span<const TensorSource> tensors, const fs::path& directory,
                           const SaveOptions& options) {
  const auto t0 = Clock::now();
  std::error_code ec;
  fs::create_directories(directory, ec);
  if (ec) {
    throw IoError(ec.value(), "mkdir", directory.string(), 0, 0, 0,
                  fmt::format("{} (the checkpoint's folder)", ec.message()));
  }
  const fs::path index_path = directory / kIndexName;
  const std::set<std::string> old_names = index_shard_names(index_path);
  checkpoint::remove_stale_temps(directory, old_names);

  // The shards, every one written under its temporary name at once.
  const std::vector<std::size_t> where = assign_shards(tensors, options.max_shard_size);
  const std::size_t count = tensors.empty() ? 1 : where.back() + 1;
  std::vector<ShardWrite> shards(count);
  std::vector<std::string> final_names(count);
  for (std::size_t i = 0; i < tensors.size(); ++i) shards[where[i]].tensors.push_back(tensors[i]);
  for (std::size_t s = 0; s < count; ++s) {
    final_names[s] = shard_file_name(s, count);
    shards[s].layout = safetensors_layout(shards[s].tensors, options.metadata,
                                          (directory / final_names[s]).string());
  }
  SaveReport report;
  for (ShardWrite& s : shards) {
    s.out = std::make_unique<checkpoint::AtomicFile>(directory / final_names[&s - shards.data()],
                                                     file_options(options));
    submit(s);
  }
  std::exception_ptr failed;
  for (ShardWrite& s : shards) {
    try {
      complete(s, options.durable, report);
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);  // every temporary file is removed

  // A shard name the old index uses may only be replaced once no index names it: first an index
  // naming the new shards under their temporary names, then the final names, then the index.
  bool interim = false;
  for (const std::string& name : final_names) interim = interim || old_names.count(name) > 0;
  if (interim) {
    std::vector<std::string> temp_names;
    for (const ShardWrite& s : shards) temp_names.push_back(s.out->temp().filename().string());
    write_small(index_path, index_json(shards, temp_names), options);
    for (ShardWrite& s : shards) s.out->release();  // an index names them now
    for (std::size_t s = 0; s < count; ++s) {
      link_over(shards[s].out->temp(), shards[s].out->dest(), s);
    }
  } else {
    for (ShardWrite& s : shards) s.out->commit(false);
  }
  if (options.durable) checkpoint::sync_folder(directory);
  const std::string index_text = index_json(shards, final_names);
  write_small(index_path, index_text, options);

  // The new checkpoint is in place: drop what the old one used and the new one does not.
  std::set<std::string> keep(final_names.begin(), final_names.end());
  std::set<std::string> stale = old_names;
  static const std::regex kShardName(R"(model(-\d{5}-of-\d{5})?\.safetensors)");
  for (const auto& e : fs::directory_iterator(directory, ec)) {
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, kShardName)) stale.insert(name);
  }
  if (interim) {
    for (const ShardWrite& s : shards) stale.insert(s.out->temp().filename().string());
  }
  for (const std::string& name : stale) {
    if (keep.count(name) == 0 && name.find('/') == std::string::npos) {
      ::unlink((directory / name).c_str());
    }
  }
  if (options.durable) checkpoint::sync_folder(directory);

  for (const std::string& name : final_names) report.files.push_back((directory / name).string());
  report.files.push_back(index_path.string());
  report.bytes += index_text.size();
  report.seconds = since(t0);
  return report;
}

}  // namespace ferry
