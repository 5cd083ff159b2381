// save_file and save_checkpoint: the header from host memory and the tensors by one scattered
// write per kind of memory (GPU tensors staged through the POSIX backend's pinned staging buffers
// by its writer that copies ahead), each file through an AtomicFile. The directory protocol that
// keeps the old checkpoint whole until the new index lands is in docs/checkpoints.md ("Saving").
#include "ferry/checkpoint_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "checkpoint/folder_commit.h"
#include "checkpoint/progress_meter.h"
#include "checkpoint/temp_file.h"
#include "ferry/atomic_file.h"

namespace ferry {

namespace fs = std::filesystem;
using checkpoint::save_file_options;
using checkpoint::seconds_since;

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kIndexName = "model.safetensors.index.json";

// One shard on its way: its tensors, layout and the requests writing them.
struct ShardWrite {
  std::vector<TensorSource> tensors;
  SafetensorsLayout layout;
  std::unique_ptr<AtomicFile> out;
  std::vector<IoFuture> requests;
  bool written = false;  // every request done and the file synced (complete())
};

// Bytes of `shards` written so far, for the progress callback: a written shard's whole file, the
// others' requests' progress.
std::uint64_t bytes_written(std::span<const ShardWrite> shards) {
  std::uint64_t bytes = 0;
  for (const ShardWrite& s : shards) {
    if (s.written) {
      bytes += s.layout.file_size;
      continue;
    }
    for (const IoFuture& r : s.requests) bytes += r.progress();
  }
  return bytes;
}

// Submits the header (host memory, one write) and the tensors (one scattered write per kind of
// memory and device they live in; empty tensors have no bytes to write).
void submit(ShardWrite& s) {
  File& f = s.out->file();
  try {
    s.requests.push_back(f.pwrite(s.layout.header.data(), s.layout.header.size(), 0));
    checkpoint::WriteGroups groups;
    for (std::size_t i : s.layout.order) {
      checkpoint::add_write(groups, s.layout.offset[i], s.tensors[i].data, s.tensors[i].nbytes);
    }
    for (const auto& [kind, ranges] : groups) s.requests.push_back(f.pwrite_scatter(ranges));
  } catch (const IoError&) {
    checkpoint::rethrow_naming(s.out->dest(), s.out->temp());
  }
}

// Waits for every request of `s` (all of them, also after a failure, the progress callback's
// included), then fsyncs and closes. `meter` is told `all` of the save's shards' progress.
void complete(ShardWrite& s, bool durable, SaveReport& report, checkpoint::ProgressMeter& meter,
              std::span<const ShardWrite> all) {
  std::exception_ptr failed;
  for (std::size_t i = 0; i < s.requests.size(); ++i) {
    IoFuture& r = s.requests[i];
    try {
      meter.wait(r, [all] { return bytes_written(all); });
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
  s.written = true;
  report.bytes += s.layout.file_size;
  report.tensors += s.tensors.size();
}

// What the folder loads as now: the files its index names, or without an index every
// .safetensors file in it (what a loader of the folder reads).
struct Live {
  bool indexed = false;
  std::set<std::string> names;
};

Live live_checkpoint(const fs::path& dir) {
  Live live;
  std::error_code ec;
  const fs::path index = dir / kIndexName;
  live.indexed = fs::exists(fs::symlink_status(index, ec));
  if (live.indexed) {
    std::ifstream in(index);
    std::stringstream text;
    text << in.rdbuf();
    const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
    if (j.is_object() && j.contains("weight_map") && j["weight_map"].is_object()) {
      for (const auto& [tensor, file] : j["weight_map"].items()) {
        if (file.is_string()) live.names.insert(file.get<std::string>());
      }
    }
    return live;
  }
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".safetensors")) live.names.insert(name);
  }
  return live;
}

// A second name for `temp` (a file an index names) at `dest`: a link under a temporary name,
// renamed over `dest`, so that `dest` is replaced in one step and `temp` stays valid.
void link_over(const fs::path& temp, const fs::path& dest) {
  checkpoint::TempFile aux(dest);  // a fresh name; its empty file is replaced by the link
  if (::unlink(aux.path().c_str()) != 0 || ::link(temp.c_str(), aux.path().c_str()) != 0) {
    const int err = errno;
    throw IoError(err, "link", dest.string(), 0, 0, 0,
                  fmt::format("{} (naming {} as {})", std::strerror(err), temp.string(),
                              aux.path().string()));
  }
  if (::rename(aux.path().c_str(), dest.c_str()) != 0) {
    const int err = errno;
    ::unlink(aux.path().c_str());
    throw IoError(err, "rename", dest.string(), 0, 0, 0, std::strerror(err));
  }
}

}  // namespace

std::string SaveReport::summary() const {
  return fmt::format("{} tensors, {} B in {} file(s) in {:.4f} s: {:.2f} GB/s, {} request(s){}",
                     tensors, bytes, files.size(), seconds,
                     seconds > 0 ? bytes / seconds / 1e9 : 0.0, routes.size(),
                     fsyncs > 0 ? fmt::format(", {} fsync(s)", fsyncs) : "");
}

SaveReport save_file(std::span<const TensorSource> tensors, const fs::path& file,
                     const SaveOptions& options) {
  const auto t0 = Clock::now();
  SaveReport report;
  refuse_remote_destination(file);
  ShardWrite s;
  s.tensors.assign(tensors.begin(), tensors.end());
  s.layout = safetensors_layout(s.tensors, options.metadata, file.string());
  remove_stale_temps(checkpoint::folder_of(file));
  s.out = std::make_unique<AtomicFile>(file, save_file_options(options));
  submit(s);
  checkpoint::ProgressMeter meter(options.progress, s.layout.file_size);
  complete(s, options.durable, report, meter, std::span<const ShardWrite>(&s, 1));
  meter.finish();  // before the rename: a callback that throws leaves `file` as it was
  {
    // The rename under the folder's save lock: a save_checkpoint there, which removes the
    // model*.safetensors files its index does not name, never runs across it.
    const checkpoint::FolderLock lock(checkpoint::folder_of(file),
                                      checkpoint::FolderLock::Mode::kWait);
    s.out->commit(options.durable);
  }
  report.files.push_back(file.string());
  report.fsyncs = options.durable ? 2 : 0;  // the file, then its folder after the rename
  report.seconds = seconds_since(t0);
  return report;
}

SaveReport save_checkpoint(std::span<const TensorSource> tensors, const fs::path& directory,
                           const SaveOptions& options) {
  const auto t0 = Clock::now();
  if (directory.empty()) {
    throw IoError(EINVAL, "save", "\"\"", 0, 0, 0, "empty path: name the checkpoint's folder");
  }
  refuse_remote_destination(directory);
  if (tensors.empty()) {
    throw IoError(EINVAL, "save", directory.string(), 0, 0, 0,
                  "no tensors to save: a checkpoint of no tensors would not load (an index names "
                  "at least one tensor); nothing was written");
  }
  checkpoint::make_folders(directory, options.durable);
  const checkpoint::FolderLock lock(directory, checkpoint::FolderLock::Mode::kWait);
  remove_stale_temps(directory);  // keeps what an index names: a save stopped after its commit
  const Live live = live_checkpoint(directory);
  const fs::path index_path = directory / kIndexName;

  // 1. Every shard under its temporary name, written and (when durable) fsynced. A failure
  // removes them all, and nothing else changed.
  const ShardAssignment where = assign_shards(tensors, options.max_shard_size);
  const std::size_t count = where.count;
  std::vector<ShardWrite> shards(count);
  std::vector<std::string> final_names(count);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    shards[where.shard[i]].tensors.push_back(tensors[i]);
  }
  for (std::size_t s = 0; s < count; ++s) {
    final_names[s] = shard_file_name(s, count);
    shards[s].layout = safetensors_layout(shards[s].tensors, options.metadata,
                                          (directory / final_names[s]).string());
  }
  SaveReport report;
  for (std::size_t s = 0; s < count; ++s) {
    shards[s].out =
        std::make_unique<AtomicFile>(directory / final_names[s], save_file_options(options));
    submit(shards[s]);
  }
  std::uint64_t total = 0;
  for (const ShardWrite& s : shards) total += s.layout.file_size;
  checkpoint::ProgressMeter meter(options.progress, total);
  std::exception_ptr failed;
  for (ShardWrite& s : shards) {
    try {
      complete(s, options.durable, report, meter, shards);
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  meter.finish();  // before the commit: a callback that throws leaves the old checkpoint whole

  // 2. The commit: the index rename. When no final name is in use by the folder's checkpoint
  // (and a bare folder of shards will not see new ones appear beside its own), the shards take
  // their final names first; else the index first names them by their temporary names, and the
  // final names follow under a second index (docs/checkpoints.md, "Sharded saves").
  bool direct = live.indexed || live.names.empty();
  for (const std::string& name : final_names) direct = direct && live.names.count(name) == 0;
  bool renamed = false;
  if (direct) {
    std::size_t placed = 0;
    try {
      for (; placed < count; ++placed) shards[placed].out->commit(false);
      if (options.durable) sync_folder(directory);
      checkpoint::write_commit_file(index_path, checkpoint_index_json(tensors, where, final_names),
                                    save_file_options(options), options.durable, renamed);
    } catch (...) {
      if (renamed) checkpoint::rethrow_after_commit(directory, "its index's folder fsync failed");
      // The old checkpoint stands: the names placed were in use by none of it.
      for (std::size_t s = 0; s < placed; ++s) ::unlink((directory / final_names[s]).c_str());
      throw;
    }
  } else {
    std::vector<std::string> temp_names;
    for (const ShardWrite& s : shards) temp_names.push_back(s.out->temp().filename().string());
    try {
      checkpoint::write_commit_file(index_path, checkpoint_index_json(tensors, where, temp_names),
                                    save_file_options(options), options.durable, renamed);
    } catch (...) {
      if (!renamed) throw;  // the old index stands; the shards' temporary files are removed
      for (ShardWrite& s : shards) s.out->release();
      checkpoint::rethrow_after_commit(directory,
                                       "under temporary names: its index's folder fsync failed");
    }
    for (ShardWrite& s : shards) s.out->release();  // the index names them now
    try {
      for (std::size_t s = 0; s < count; ++s)
        link_over(shards[s].out->temp(), directory / final_names[s]);
      if (options.durable) sync_folder(directory);
      checkpoint::write_commit_file(index_path, checkpoint_index_json(tensors, where, final_names),
                                    save_file_options(options), options.durable, renamed);
    } catch (...) {
      if (!renamed) {
        checkpoint::rethrow_after_commit(
            directory,
            "under temporary names, which its index names; the next save tidies "
            "them");
      }
      checkpoint::rethrow_after_commit(directory, "its second index's folder fsync failed");
    }
    for (const std::string& name : temp_names) ::unlink((directory / name).c_str());
  }

  // 3. Files of the old checkpoint that the new one does not use, once the new index is durable:
  // the names the old index gave, and shard names of transformers' pattern. Other files
  // (config.json, tokenizer, an adapter's .safetensors beside a folder without an index) stay.
  std::set<std::string> keep(final_names.begin(), final_names.end());
  std::set<std::string> stale;
  if (live.indexed) stale = live.names;
  static const std::regex kShardName(R"(model(-\d{5}-of-\d{5})?\.safetensors)");
  int single_errno = 0;
  try {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(directory, ec)) {
      const std::string name = e.path().filename().string();
      if (std::regex_match(name, kShardName)) stale.insert(name);
    }
    for (const std::string& name : stale) {
      if (keep.count(name) > 0 || name.find('/') != std::string::npos) continue;
      if (::unlink((directory / name).c_str()) != 0 && errno != ENOENT &&
          name == "model.safetensors") {
        single_errno = errno;
      }
    }
    if (options.durable) sync_folder(directory);
  } catch (const IoError&) {
    checkpoint::rethrow_after_commit(directory, "removing the old checkpoint's files failed");
  }
  if (single_errno != 0) {
    throw IoError(single_errno, "unlink", (directory / "model.safetensors").string(), 0, 0, 0,
                  fmt::format("{}: the new checkpoint is committed in {} (its index names {} "
                              "shard(s)), but the old model.safetensors could not be removed, and "
                              "transformers' from_pretrained reads model.safetensors before the "
                              "index: it would load the old weights. Remove it",
                              std::strerror(single_errno), directory.string(), count));
  }

  for (const std::string& name : final_names) report.files.push_back((directory / name).string());
  report.files.push_back(index_path.string());
  report.bytes += checkpoint_index_json(tensors, where, final_names).size();
  report.seconds = seconds_since(t0);
  return report;
}

}  // namespace ferry
