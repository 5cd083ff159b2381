// A DCP folder opened: each tensor chunk's torch.save blob located (its headers read a file's
// regions at a time) and placed as byte ranges of the whole tensor.
#include "checkpoint/dcp_folder.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

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
  BlobRegions(File& file, const ByteRanges& wanted, DcpFolder& counts)
      : file_(file), counts_(counts) {
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
    ++counts_.open_reads;
    counts_.open_bytes += b.size();
    return b;
  }
  File& file_;
  DcpFolder& counts_;
  std::vector<std::pair<std::uint64_t, std::string>> regions_;  // by offset
};

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
    const fs::path path = dir / relative;
    if (fs::path(relative).is_absolute() || relative.find("..") != std::string::npos) {
      throw CheckpointError(meta.path(), tensor,
                            fmt::format("names storage '{}' outside the folder", relative));
    }
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      throw CheckpointError(path.string(), tensor,
                            "missing: .metadata puts this tensor's bytes here");
    }
    out.files.push_back(std::make_unique<File>(path, "r", options));
    out.shard_names.push_back(out.files.back()->path());
    return it->second;
  };
  // Every chunk's blob inside its file, and its head and tail, before anything is read from it.
  std::vector<ByteRanges> wanted;
  for (const DcpTensorMeta& t : md.tensors) {
    for (const DcpChunk& c : t.chunks) {
      const std::size_t k = shard(c.relative_path, t.name);
      const File& file = *out.files[k];
      if (c.offset > file.size() || c.length > file.size() - c.offset) {
        throw CheckpointError(file.path(), t.name,
                              fmt::format("its chunk at offset {} (+{} B) passes the file's end "
                                          "at {} B: truncated",
                                          c.offset, c.length, file.size()));
      }
      wanted.resize(out.files.size());
      const std::uint64_t end = c.offset + c.length;
      wanted[k].emplace_back(c.offset, c.offset + std::min(c.length, kBlobHead));
      wanted[k].emplace_back(end - std::min(c.length, kTorchSaveTailBytes), end);
    }
  }
  std::vector<BlobRegions> regions;
  regions.reserve(out.files.size());
  for (std::size_t k = 0; k < out.files.size(); ++k)
    regions.emplace_back(*out.files[k], wanted[k], out);
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
