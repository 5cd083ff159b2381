// A DCP folder opened: each tensor chunk's torch.save blob located (its headers read a file's
// regions at a time) and placed as byte ranges of the whole tensor.
#include "checkpoint/dcp_folder.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>

#include "checkpoint/folder_commit.h"
#include "checkpoint/progress_meter.h"
#include "checkpoint/torch_save_writer.h"
#include "ferry/dcp_reader.h"
#include "ferry/memory.h"

namespace ferry::checkpoint {

namespace fs = std::filesystem;

namespace {

// A tensor saved as a view whose innermost stride is not 1 reads element by element; past this
// many pieces it is refused rather than read a few bytes at a time.
constexpr std::size_t kMaxPieces = std::size_t{1} << 20;

}  // namespace

std::vector<TensorPiece> place_chunk(const DcpTensorMeta& tensor, const DcpChunk& chunk,
                                     const TorchTensorRecord& record, std::size_t shard,
                                     const std::string& file) {
  auto fail = [&](const std::string& why) -> void {
    throw CheckpointError(file, tensor.name, why);
  };
  const std::size_t rank = tensor.shape.size();
  if (chunk.offsets.size() != rank || chunk.sizes.size() != rank || record.size != chunk.sizes) {
    fail(fmt::format("its chunk at offset {} holds a tensor of another shape", chunk.offset));
  }
  // A typed storage names its dtype (an untyped one does not): its bytes are read as `dtype`'s.
  const std::string typed = "torch." + torch_storage_class(tensor.dtype);
  if (record.storage_class != "torch.storage.UntypedStorage" && record.storage_class != typed) {
    fail(fmt::format("its chunk at offset {} holds a {}, not the {} .metadata lists", chunk.offset,
                     record.storage_class, to_string(tensor.dtype)));
  }
  const std::uint64_t element = dtype_bits(tensor.dtype) / 8;
  unsigned __int128 count = 1, last = record.storage_offset;  // the last storage element read
  for (std::size_t d = 0; d < rank; ++d) {
    if (chunk.offsets[d] > tensor.shape[d] || chunk.sizes[d] > tensor.shape[d] - chunk.offsets[d]) {
      fail(fmt::format("a chunk passes the tensor's end along dimension {}", d));
    }
    count *= chunk.sizes[d];
    if (chunk.sizes[d] > 0)
      last += static_cast<unsigned __int128>(chunk.sizes[d] - 1) * record.stride[d];
  }
  if (count == 0) return {};
  if ((last + 1) * element > record.data_length) {
    fail(fmt::format("its chunk at offset {} reads past its storage's {} B", chunk.offset,
                     record.data_length));
  }
  // Destination strides: the whole tensor, contiguous.
  std::vector<std::uint64_t> dest_stride(rank, 1);
  for (std::size_t d = rank; d-- > 1;) dest_stride[d - 1] = dest_stride[d] * tensor.shape[d];
  // The innermost dimensions contiguous in both the storage and the tensor make one run.
  std::uint64_t run = 1;
  std::size_t outer = rank;
  while (outer > 0) {
    const std::size_t d = outer - 1;
    if (chunk.sizes[d] != 1 && (record.stride[d] != run || dest_stride[d] != run)) break;
    run *= chunk.sizes[d];
    --outer;
  }
  if (count / run > kMaxPieces) {
    fail(fmt::format("saved as a view that would take {} reads (more than {}); not supported yet",
                     static_cast<std::uint64_t>(count / run), kMaxPieces));
  }
  std::vector<TensorPiece> pieces;
  std::vector<std::uint64_t> index(outer, 0);
  for (;;) {
    std::uint64_t src = record.storage_offset, dst = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      const std::uint64_t i = d < outer ? index[d] : 0;
      src += i * record.stride[d];
      dst += (chunk.offsets[d] + i) * dest_stride[d];
    }
    TensorPiece p{shard, record.data_offset + src * element, run * element, dst * element};
    if (!pieces.empty() && pieces.back().file_offset + pieces.back().length == p.file_offset &&
        pieces.back().dest + pieces.back().length == p.dest) {
      pieces.back().length += p.length;
    } else {
      pieces.push_back(p);
    }
    std::size_t d = outer;
    while (d > 0 && ++index[d - 1] == chunk.sizes[d - 1]) index[--d] = 0;
    if (d == 0) break;
  }
  return pieces;
}

ByteRanges merge_regions(ByteRanges wanted, std::uint64_t max_gap, std::uint64_t max_region) {
  std::sort(wanted.begin(), wanted.end());
  ByteRanges out;
  for (const auto& [begin, end] : wanted) {
    if (end <= begin) continue;
    if (!out.empty() && begin <= out.back().second + max_gap &&
        std::max(end, out.back().second) - out.back().first <= max_region) {
      out.back().second = std::max(out.back().second, end);
    } else {
      out.emplace_back(begin, end);
    }
  }
  return out;
}

namespace {

// A blob's head, read at open: its first entries' local headers and data.pkl, and the storage's
// local header after them, which torch writes in the first ~700 B (tests/data/dcp: the data
// starts at byte 704 of every blob); a data.pkl too large for it costs one more read.
constexpr std::uint64_t kBlobHead = 4096;
// Regions of a file closer than this are read as one (a read of 4 KiB more costs less than one
// more read), up to kMaxRegion each, so that a file of many small chunks is not read whole at once.
constexpr std::uint64_t kRegionGap = 4096;
constexpr std::uint64_t kMaxRegion = 64u << 20;

// One .distcp file's blob headers: the regions merge_regions made of every chunk's head and tail,
// each read once, and the reads of read_torch_save_tensor served from them. A read outside them
// goes to the file, counted with the rest.
class BlobRegions {
 public:
  BlobRegions(File& file, const ByteRanges& wanted, std::uint64_t& reads, std::uint64_t& bytes)
      : file_(file), reads_(reads), bytes_(bytes) {
    for (const auto& [begin, end] : merge_regions(wanted, kRegionGap, kMaxRegion)) {
      regions_.emplace_back(begin, read(begin, end - begin));
    }
  }
  std::string get(std::uint64_t at, std::uint64_t n) {
    auto r = std::upper_bound(regions_.begin(), regions_.end(), at,
                              [](std::uint64_t x, const auto& region) { return x < region.first; });
    if (r != regions_.begin()) {
      const auto& [begin, bytes] = *std::prev(r);
      if (at - begin <= bytes.size() && n <= bytes.size() - (at - begin)) {
        return bytes.substr(at - begin, n);
      }
    }
    return read(at, n);
  }

 private:
  std::string read(std::uint64_t at, std::uint64_t n) {
    std::string b(n, '\0');
    b.resize(n == 0 ? 0 : file_.read(b.data(), n, at));
    ++reads_;
    bytes_ += b.size();
    return b;
  }
  File& file_;
  std::uint64_t& reads_;
  std::uint64_t& bytes_;
  std::vector<std::pair<std::uint64_t, std::string>> regions_;  // by offset
};

// A .distcp file that `named_by` puts `tensor`'s bytes in, opened; CheckpointError where it is
// missing or lies outside the folder.
std::unique_ptr<File> open_shard(const fs::path& dir, const std::string& relative,
                                 const std::string& named_by, const std::string& tensor,
                                 const FileOptions& options) {
  if (fs::path(relative).is_absolute() || relative.find("..") != std::string::npos) {
    throw CheckpointError(named_by, tensor,
                          fmt::format("names storage '{}' outside the folder", relative));
  }
  const fs::path path = dir / relative;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw CheckpointError(path.string(), tensor,
                          "missing: .metadata puts this tensor's bytes here");
  }
  return std::make_unique<File>(path, "r", options);
}

// The head and tail of a blob, which locating its tensor reads; CheckpointError where the blob
// passes the file's end.
void want_blob(const File& file, std::uint64_t offset, std::uint64_t length,
               const std::string& tensor, ByteRanges& wanted) {
  if (offset > file.size() || length > file.size() - offset) {
    throw CheckpointError(file.path(), tensor,
                          fmt::format("its chunk at offset {} (+{} B) passes the file's end "
                                      "at {} B: truncated",
                                      offset, length, file.size()));
  }
  const std::uint64_t end = offset + length;
  wanted.emplace_back(offset, offset + std::min(length, kBlobHead));
  wanted.emplace_back(end - std::min(length, kTorchSaveTailBytes), end);
}

}  // namespace

DcpFolder open_dcp_folder(const fs::path& dir, const FileOptions& options) {
  const fs::path meta_path = dir / ".metadata";
  File meta(meta_path, "r", options);
  std::string bytes(meta.size(), '\0');
  if (!bytes.empty() && meta.read(bytes.data(), bytes.size(), 0) != bytes.size()) {
    throw CheckpointError(meta.path(), "", "the file ended early");
  }
  const DcpMetadata md = parse_dcp_metadata(bytes, meta.path());
  DcpFolder out;
  out.open_reads = 1;
  out.open_bytes = bytes.size();
  out.byte_items = md.byte_items;
  std::map<std::string, std::size_t> shard_of;
  auto shard = [&](const std::string& relative, const std::string& tensor) {
    auto [it, fresh] = shard_of.emplace(relative, out.files.size());
    if (!fresh) return it->second;
    out.files.push_back(open_shard(dir, relative, meta.path(), tensor, options));
    out.shard_names.push_back(out.files.back()->path());
    return it->second;
  };
  // Every chunk's blob inside its file, and its head and tail, before anything is read from it.
  std::vector<ByteRanges> wanted;
  for (const DcpTensorMeta& t : md.tensors) {
    for (const DcpChunk& c : t.chunks) {
      const std::size_t k = shard(c.relative_path, t.name);
      wanted.resize(out.files.size());
      want_blob(*out.files[k], c.offset, c.length, t.name, wanted[k]);
    }
  }
  std::vector<BlobRegions> regions;
  regions.reserve(out.files.size());
  for (std::size_t k = 0; k < out.files.size(); ++k)
    regions.emplace_back(*out.files[k], wanted[k], out.open_reads, out.open_bytes);
  for (const DcpTensorMeta& t : md.tensors) {
    const std::uint64_t element = dtype_bits(t.dtype) / 8;
    unsigned __int128 nbytes = element, covered = 0;
    for (std::uint64_t extent : t.shape) nbytes *= extent;
    std::vector<TensorPiece> pieces;
    for (const DcpChunk& c : t.chunks) {
      const std::size_t k = shard_of.at(c.relative_path);
      BlobRegions& blob = regions[k];
      const std::string& file = out.shard_names[k];
      const TorchTensorRecord record =
          read_torch_save_tensor([&](std::uint64_t at, std::uint64_t n) { return blob.get(at, n); },
                                 c.offset, c.length, file);
      std::vector<TensorPiece> placed = place_chunk(t, c, record, k, file);
      for (const TensorPiece& p : placed) covered += p.length;
      pieces.insert(pieces.end(), placed.begin(), placed.end());
    }
    if (covered != nbytes) {
      throw CheckpointError(
          meta.path(), t.name,
          fmt::format("its chunks hold {} B of its {} B", static_cast<std::uint64_t>(covered),
                      static_cast<std::uint64_t>(nbytes)));
    }
    std::sort(pieces.begin(), pieces.end(),
              [](const TensorPiece& a, const TensorPiece& b) { return a.dest < b.dest; });
    TensorInfo info{t.name,
                    t.dtype,
                    t.shape,
                    pieces.empty() ? 0 : pieces[0].file_offset,
                    static_cast<std::uint64_t>(nbytes),
                    pieces.empty() ? 0 : pieces[0].shard};
    out.tensors.push_back(std::move(info));
    out.pieces.push_back(std::move(pieces));
  }
  return out;
}

}  // namespace ferry::checkpoint

namespace ferry {

LoadReport read_dcp_items(const std::filesystem::path& dir, std::span<const DcpReadItem> items,
                          const FileOptions& options) {
  using namespace checkpoint;
  const auto t0 = std::chrono::steady_clock::now();
  LoadReport report;
  report.tensors = items.size();
  // Each file opened once, and the heads and tails of its items' blobs.
  std::map<std::string, std::size_t> file_of;
  std::vector<std::unique_ptr<File>> files;
  std::vector<ByteRanges> wanted;
  std::vector<std::size_t> item_file(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const DcpReadItem& item = items[i];
    auto [it, fresh] = file_of.emplace(item.relative_path, files.size());
    if (fresh) {
      files.push_back(
          open_shard(dir, item.relative_path, (dir / ".metadata").string(), item.name, options));
      wanted.emplace_back();
    }
    item_file[i] = it->second;
    want_blob(*files[it->second], item.blob_offset, item.blob_length, item.name,
              wanted[it->second]);
  }
  std::vector<BlobRegions> regions;
  regions.reserve(files.size());
  for (std::size_t k = 0; k < files.size(); ++k) {
    regions.emplace_back(*files[k], wanted[k], report.open_reads, report.open_bytes);
  }
  // Each region placed as byte ranges of its file into its buffer: the region is a tensor of its
  // own, the chunk's view moved to the region's first element, placed whole into the buffer.
  // The ranges of a file go by kind of memory and device: one gathered request each.
  std::vector<std::map<std::pair<int, int>, std::vector<ReadRange>>> ranges(files.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const DcpReadItem& item = items[i];
    const std::size_t k = item_file[i];
    BlobRegions& blob = regions[k];
    const std::string& file = files[k]->path();
    TorchTensorRecord view =
        read_torch_save_tensor([&](std::uint64_t at, std::uint64_t n) { return blob.get(at, n); },
                               item.blob_offset, item.blob_length, file);
    const std::size_t rank = view.size.size();
    if (item.offsets.size() != rank || item.lengths.size() != rank) {
      throw CheckpointError(file, item.name,
                            fmt::format("asks for a region of {} dimensions of a chunk of {}",
                                        item.lengths.size(), rank));
    }
    for (std::size_t d = 0; d < rank; ++d) {
      if (item.offsets[d] > view.size[d] || item.lengths[d] > view.size[d] - item.offsets[d]) {
        throw CheckpointError(
            file, item.name,
            fmt::format("asks for elements {}..{} of dimension {}, which its chunk at offset {} "
                        "holds {} of",
                        item.offsets[d], item.offsets[d] + item.lengths[d], d, item.blob_offset,
                        view.size[d]));
      }
      const unsigned __int128 start =
          view.storage_offset + static_cast<unsigned __int128>(item.offsets[d]) * view.stride[d];
      if (start > UINT64_MAX) {
        throw CheckpointError(
            file, item.name,
            fmt::format("its chunk at offset {} has strides past 2^64 elements", item.blob_offset));
      }
      view.storage_offset = static_cast<std::uint64_t>(start);
    }
    view.size = item.lengths;
    const DcpTensorMeta region{item.name, item.dtype, item.lengths, {}};
    const DcpChunk chunk{std::vector<std::uint64_t>(rank, 0), item.lengths, item.relative_path,
                         item.blob_offset, item.blob_length};
    const std::vector<TensorPiece> pieces = place_chunk(region, chunk, view, k, file);
    if (pieces.empty()) continue;
    const MemoryInfo memory = classify_memory(item.buffer);
    std::vector<ReadRange>& group = ranges[k][{static_cast<int>(memory.kind), memory.device}];
    for (const TensorPiece& p : pieces) {
      group.push_back({p.file_offset, static_cast<std::size_t>(p.length),
                       static_cast<char*>(item.buffer) + p.dest});
      report.bytes += p.length;
    }
  }
  // Every file's requests in flight together, then each waited for.
  std::vector<IoFuture> requests;
  std::exception_ptr failed;
  try {
    for (std::size_t k = 0; k < files.size(); ++k) {
      for (const auto& [memory, group] : ranges[k]) {
        requests.push_back(files[k]->pread_gather(group));
      }
    }
  } catch (...) {
    failed = std::current_exception();
  }
  wait_all(requests, nullptr, &report.routes, failed);
  report.bytes_read = report.bytes;
  report.seconds = checkpoint::seconds_since(t0);
  return report;
}

}  // namespace ferry
