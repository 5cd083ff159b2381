// DCP's data files and commit (ferry/dcp_writer.h). A .distcp file holds its items back to back
// as stock FileSystemWriter writes them, except that a tensor's bytes start aligned (its blob's
// padding field), so that they can go by O_DIRECT or cuFile from where they live.
#include "ferry/dcp_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include "checkpoint/folder_commit.h"
#include "checkpoint/temp_file.h"
#include "checkpoint/torch_save_writer.h"
#include "ferry/atomic_file.h"
#include "ferry/memory.h"

namespace ferry {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMetadataName = ".metadata";
constexpr std::uint64_t kAlignment = 4096;
constexpr std::uint64_t kSmallAlignment = 64;  // torch.save's own, for tensors under 4096 B

FileOptions file_options(const SaveOptions& options) {
  FileOptions f = options.file;
  f.write_behind = f.write_behind || options.durable;
  return f;
}

}  // namespace

std::vector<DcpItemPlace> write_dcp_file(std::span<const DcpWriteItem> items, const fs::path& file,
                                         const SaveOptions& options) {
  refuse_remote_destination(file);
  std::vector<DcpItemPlace> places;
  std::vector<std::string> records;  // the blobs' heads and tails, alive until written
  records.reserve(2 * items.size());
  std::map<std::pair<int, int>, std::vector<WriteRange>> groups;  // by kind of memory, device
  auto add = [&](std::uint64_t at, const void* data, std::uint64_t n) {
    if (n == 0) return;
    const MemoryInfo m = classify_memory(data);
    groups[{static_cast<int>(m.kind), m.device}].push_back({at, static_cast<std::size_t>(n), data});
  };
  std::uint64_t at = 0;
  for (const DcpWriteItem& item : items) {
    if (item.is_bytes) {
      places.push_back({at, item.bytes.size()});
      add(at, item.bytes.data(), item.bytes.size());
      at += item.bytes.size();
      continue;
    }
    const TensorSource& t = item.tensor;
    const std::uint64_t align = t.nbytes >= kAlignment ? kAlignment : kSmallAlignment;
    checkpoint::TorchSaveBlob blob;
    try {
      blob = checkpoint::torch_save_blob(t.name, t.dtype, t.shape, at, align);
    } catch (const CheckpointError& e) {
      throw CheckpointError(file.string(), t.name, e.what());
    }
    const std::uint64_t want = blob.length - blob.head.size() - blob.tail.size();
    if (want != t.nbytes) {
      throw CheckpointError(file.string(), t.name,
                            fmt::format("{} B given for a tensor of {} B (shape x dtype): a DCP "
                                        "item is saved contiguous",
                                        t.nbytes, want));
    }
    places.push_back({at, blob.length});
    records.push_back(std::move(blob.head));
    add(at, records.back().data(), records.back().size());
    add(blob.data_offset, t.data, t.nbytes);
    records.push_back(std::move(blob.tail));
    add(blob.data_offset + t.nbytes, records.back().data(), records.back().size());
    at += blob.length;
  }

  AtomicFile out(file, file_options(options));
  std::vector<IoFuture> requests;
  std::exception_ptr failed;
  try {
    for (const auto& [kind, ranges] : groups) requests.push_back(out.file().pwrite_scatter(ranges));
  } catch (...) {
    failed = std::current_exception();
  }
  // Every request is waited for, also after a failure: they read the caller's memory.
  for (IoFuture& r : requests) {
    try {
      r.get();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) {
    try {
      std::rethrow_exception(failed);
    } catch (const IoError&) {
      checkpoint::rethrow_naming(file, out.temp());
    }
  }
  out.commit(options.durable);
  return places;
}

DcpSaveLock::DcpSaveLock(const fs::path& dir, bool durable) {
  refuse_remote_destination(dir);
  checkpoint::make_folders(dir, durable);
  lock_ = std::make_unique<checkpoint::FolderLock>(dir, checkpoint::FolderLock::Mode::kRefuse);
  remove_stale_temps(dir);
}

DcpSaveLock::~DcpSaveLock() = default;

void commit_dcp_metadata(const fs::path& dir, std::string_view metadata,
                         std::span<const std::string> files, const SaveOptions& options) {
  bool renamed = false;
  try {
    checkpoint::write_commit_file(dir / kMetadataName, metadata, file_options(options),
                                  options.durable, renamed);
  } catch (const IoError&) {
    if (renamed) checkpoint::rethrow_after_commit(dir, "its folder's fsync failed");
    throw;
  }
  const std::set<std::string> keep(files.begin(), files.end());
  try {
    std::error_code ec;
    std::vector<fs::path> stale;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.ends_with(".distcp") && !keep.contains(name)) stale.push_back(e.path());
    }
    for (const fs::path& p : stale) {
      if (::unlink(p.c_str()) != 0 && errno != ENOENT) {
        const int err = errno;
        throw IoError(err, "unlink", p.string(), 0, 0, 0,
                      fmt::format("{} (a file of the old checkpoint, which the new .metadata does "
                                  "not name)",
                                  std::strerror(err)));
      }
    }
    if (options.durable && !stale.empty()) sync_folder(dir);
  } catch (const IoError&) {
    checkpoint::rethrow_after_commit(dir, "removing the old checkpoint's files failed");
  }
}

}  // namespace ferry
