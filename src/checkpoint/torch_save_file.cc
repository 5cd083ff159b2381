// ferry.torch's files (ferry/torch_save.h). A save is one zip laid out by torch_zip_layout: the
// small records from host memory and each storage from where it lives, one scattered write per
// kind of memory, through an AtomicFile, so the rename is the commit point. A load reads the zip's
// directory and data.pkl with plain preads (a few KiB) and the storages by gathered requests.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "checkpoint/folder_commit.h"
#include "checkpoint/pickle_reader.h"
#include "checkpoint/progress_meter.h"
#include "checkpoint/temp_file.h"
#include "checkpoint/torch_save_blob.h"
#include "checkpoint/torch_save_writer.h"
#include "ferry/atomic_file.h"
#include "ferry/memory.h"
#include "ferry/torch_save.h"

namespace ferry {

namespace fs = std::filesystem;
using checkpoint::save_file_options;
using checkpoint::seconds_since;

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kTorchAlignment = 64;  // torch.save's own storage alignment
constexpr std::uint64_t kMaxDataPkl = 1u << 30;

// What torch.load(weights_only=True) loads a state dict or optimizer state with.
bool allowed(std::string_view name) {
  return checkpoint::torch_save_class_allowed(name) || name == "torch._utils._rebuild_parameter" ||
         name == "torch.Size";
}

// A file read by pread, for the zip's records.
class Reader {
 public:
  explicit Reader(const fs::path& file) : file_(file.string()) {
    fd_ = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(errno, "open", 0, 0);
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail(errno, "fstat", 0, 0);
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  ~Reader() { ::close(fd_); }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  std::uint64_t size() const { return size_; }
  std::string read(std::uint64_t offset, std::uint64_t length) const {
    std::string out(length, '\0');
    std::uint64_t done = 0;
    while (done < length) {
      const ssize_t n = ::pread(fd_, out.data() + done, length - done, offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(errno, "pread", offset, length);
      if (n == 0) break;
      done += static_cast<std::uint64_t>(n);
    }
    out.resize(done);
    return out;
  }

 private:
  [[noreturn]] void fail(int err, const char* op, std::uint64_t offset,
                         std::uint64_t length) const {
    throw IoError(err, op, file_, offset, length, 0, std::strerror(err));
  }
  std::string file_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

}  // namespace

SaveReport save_torch_file(std::string_view data_pkl, std::span<const TorchStorageSource> storages,
                           const fs::path& file, std::uint64_t alignment,
                           const SaveOptions& options) {
  const auto t0 = Clock::now();
  refuse_remote_destination(file);
  if (!std::has_single_bit(alignment) || alignment < kTorchAlignment || alignment > 32768) {
    throw IoError(EINVAL, "save", file.string(), 0, 0, 0,
                  fmt::format("alignment {} is not a power of two from 64 to 32768", alignment));
  }
  std::vector<checkpoint::ZipEntry> entries;
  entries.reserve(storages.size() + 3);
  entries.push_back({"archive/data.pkl", std::string(data_pkl)});
  entries.push_back({"archive/byteorder", "little"});
  for (const TorchStorageSource& s : storages) {
    entries.push_back({"archive/data/" + s.key, "", true, s.nbytes,
                       s.nbytes >= alignment ? alignment : kTorchAlignment});
  }
  entries.push_back({"archive/version", "3\n"});
  const checkpoint::ZipLayout z = checkpoint::torch_zip_layout(entries, 0);

  checkpoint::WriteGroups groups;
  for (const checkpoint::ZipPiece& p : z.pieces)
    checkpoint::add_write(groups, p.offset, p.bytes.data(), p.bytes.size());
  for (std::size_t i = 0; i < storages.size(); ++i) {
    checkpoint::add_write(groups, z.data_offset[i + 2], storages[i].data, storages[i].nbytes);
  }

  SaveReport report;
  remove_stale_temps(checkpoint::folder_of(file));
  AtomicFile out(file, save_file_options(options));
  checkpoint::ProgressMeter meter(options.progress, z.length);
  checkpoint::write_groups(out, groups, &meter, &report.routes);
  meter.finish();  // before the rename: a callback that throws leaves `file` as it was
  out.commit(options.durable);
  report.files.push_back(file.string());
  report.bytes = z.length;
  report.tensors = storages.size();
  report.fsyncs = options.durable ? 2 : 0;  // the file, then its folder after the rename
  report.seconds = seconds_since(t0);
  return report;
}

TorchFile open_torch_file(const fs::path& file) {
  const Reader r(file);
  const std::string name = file.string();
  if (r.read(0, 2) == "\x80\x02") {
    throw CheckpointError(name, "",
                          "offset 0: a pickle, torch.save's legacy format "
                          "(_use_new_zipfile_serialization=False, or torch before 1.6), which "
                          "ferry.torch.load does not read; load it with torch.load");
  }
  const auto read = [&r](std::uint64_t offset, std::uint64_t length) {
    return r.read(offset, length);
  };
  const std::vector<checkpoint::TorchSaveEntry> entries =
      checkpoint::read_torch_save_entries(read, 0, r.size(), name);
  TorchFile out;
  for (const checkpoint::TorchSaveEntry& e : entries) {
    if (e.name != "data.pkl" && !e.name.ends_with("/data.pkl")) continue;
    if (e.length > kMaxDataPkl) {
      throw CheckpointError(name, "",
                            fmt::format("offset {}: data.pkl of {} B", e.data_offset, e.length));
    }
    out.root =
        checkpoint::read_pickle(r.read(e.data_offset, e.length), allowed, name, e.data_offset);
    const std::string data = e.name.substr(0, e.name.size() - 8) + "data/";
    for (const checkpoint::TorchSaveEntry& d : entries) {
      if (d.name.starts_with(data)) {
        out.storages[d.name.substr(data.size())] = {d.data_offset, d.length};
      }
    }
    break;
  }
  return out;
}

LoadReport read_torch_storages(const fs::path& file, std::span<const ReadRange> ranges,
                               const FileOptions& options) {
  const auto t0 = Clock::now();
  std::map<std::pair<int, int>, std::vector<ReadRange>> groups;
  LoadReport report;
  for (const ReadRange& range : ranges) {
    if (range.size == 0) continue;
    const MemoryInfo m = classify_memory(range.buffer);
    groups[{static_cast<int>(m.kind), m.device}].push_back(range);
    report.bytes += range.size;
  }
  report.tensors = ranges.size();
  if (groups.empty()) return report;
  File f(file, "r", options);
  std::vector<IoFuture> requests;
  std::exception_ptr failed;
  try {
    for (const auto& [kind, group] : groups) requests.push_back(f.pread_gather(group));
  } catch (...) {
    failed = std::current_exception();
  }
  checkpoint::wait_all(requests, nullptr, &report.routes, failed);
  report.seconds = seconds_since(t0);
  return report;
}

}  // namespace ferry
