// DCP's data files and commit (ferry/dcp_writer.h). A .distcp file holds its items back to back
// as stock FileSystemWriter writes them, except that a tensor's bytes start aligned (its blob's
// padding field), so that they can go by O_DIRECT or cuFile from where they live.
#include "ferry/dcp_writer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>

#include "checkpoint/folder_commit.h"
#include "checkpoint/progress_meter.h"
#include "checkpoint/torch_save_writer.h"
#include "ferry/atomic_file.h"

namespace ferry {

namespace fs = std::filesystem;
using checkpoint::save_file_options;
using checkpoint::seconds_since;

namespace {

constexpr const char* kMetadataName = ".metadata";
constexpr std::uint64_t kAlignment = 4096;
constexpr std::uint64_t kSmallAlignment = 64;  // torch.save's own, for tensors under 4096 B

}  // namespace

std::vector<DcpItemPlace> write_dcp_file(std::span<const DcpWriteItem> items, const fs::path& file,
                                         const SaveOptions& options, SaveReport* report) {
  const auto t0 = std::chrono::steady_clock::now();
  refuse_remote_destination(file);
  std::vector<DcpItemPlace> places;
  std::vector<std::string> records;  // the blobs' heads and tails, alive until written
  records.reserve(2 * items.size());
  checkpoint::WriteGroups groups;
  std::uint64_t at = 0;
  for (const DcpWriteItem& item : items) {
    if (item.is_bytes) {
      places.push_back({at, item.bytes.size()});
      checkpoint::add_write(groups, at, item.bytes.data(), item.bytes.size());
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
    checkpoint::add_write(groups, at, records.back().data(), records.back().size());
    checkpoint::add_write(groups, blob.data_offset, t.data, t.nbytes);
    records.push_back(std::move(blob.tail));
    checkpoint::add_write(groups, blob.data_offset + t.nbytes, records.back().data(),
                          records.back().size());
    at += blob.length;
  }

  SaveReport written;
  AtomicFile out(file, save_file_options(options));
  checkpoint::ProgressMeter meter(options.progress, at);
  checkpoint::write_groups(out, groups, &meter, &written.routes);
  meter.finish();  // before the rename: a callback that throws leaves no file
  out.commit(options.durable);
  if (report != nullptr) {
    written.files.push_back(file.string());
    written.bytes = at;
    for (const DcpWriteItem& item : items) written.tensors += item.is_bytes ? 0 : 1;
    written.fsyncs = options.durable ? 2 : 0;  // the file, then its folder after the rename
    written.seconds = seconds_since(t0);
    *report = std::move(written);
  }
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
                         std::span<const std::string> files, const SaveOptions& options,
                         SaveReport* report) {
  const auto t0 = std::chrono::steady_clock::now();
  bool renamed = false;
  try {
    checkpoint::write_commit_file(dir / kMetadataName, metadata, save_file_options(options),
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
    if (report != nullptr) {
      report->files = {(dir / kMetadataName).string()};
      report->bytes = metadata.size();
      // .metadata's temporary file and the folder after its rename; the folder again after the
      // old files went.
      report->fsyncs = options.durable ? (stale.empty() ? 2 : 3) : 0;
      report->seconds = seconds_since(t0);
    }
  } catch (const IoError&) {
    checkpoint::rethrow_after_commit(dir, "removing the old checkpoint's files failed");
  }
}

}  // namespace ferry
