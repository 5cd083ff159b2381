// DCP's format, as torch 2.11's FileSystemWriter writes it (tests/data/dcp holds stock output):
// `.metadata` pickles Metadata(state_dict_metadata={fqn: TensorStorageMetadata(properties,
// size, chunks) | BytesStorageMetadata()}, storage_data={MetadataIndex(fqn, offset, index):
// _StorageInfo(relative_path, offset, length)}, storage_meta, version); each tensor chunk is a
// whole torch.save blob at [offset, offset + length) of its file. A chunk's MetadataIndex.offset
// is the chunk's offsets, which is how the two dicts are joined.
#include "checkpoint/dcp_folder.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <set>

#include "checkpoint/pickle_reader.h"

namespace ferry::checkpoint {

namespace fs = std::filesystem;

namespace {

using Kind = PickleValue::Kind;
constexpr const char* kMeta = "torch.distributed.checkpoint.metadata.";
// A tensor saved as a view whose innermost stride is not 1 reads element by element; past this
// many pieces it is refused rather than read a few bytes at a time.
constexpr std::size_t kMaxPieces = std::size_t{1} << 20;

struct TorchDtype {
  std::string_view name;
  Dtype dtype;
};
constexpr std::array<TorchDtype, 17> kTorchDtypes{{
    {"torch.bool", Dtype::kBool},
    {"torch.uint8", Dtype::kU8},
    {"torch.int8", Dtype::kI8},
    {"torch.uint16", Dtype::kU16},
    {"torch.int16", Dtype::kI16},
    {"torch.float16", Dtype::kF16},
    {"torch.bfloat16", Dtype::kBF16},
    {"torch.uint32", Dtype::kU32},
    {"torch.int32", Dtype::kI32},
    {"torch.float32", Dtype::kF32},
    {"torch.uint64", Dtype::kU64},
    {"torch.int64", Dtype::kI64},
    {"torch.float64", Dtype::kF64},
    {"torch.complex64", Dtype::kC64},
    {"torch.float8_e4m3fn", Dtype::kF8E4M3},
    {"torch.float8_e5m2", Dtype::kF8E5M2},
    {"torch.float8_e8m0fnu", Dtype::kF8E8M0},
}};

bool metadata_class_allowed(std::string_view name) {
  static const std::set<std::string_view> kClasses = {
      "pathlib.PosixPath",
      "pathlib.PurePosixPath",
      "torch.Size",
      "torch.serialization._get_layout",
      "torch.distributed.checkpoint.filesystem._StorageInfo",
      "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
      "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
      "torch.distributed.checkpoint.metadata.Metadata",
      "torch.distributed.checkpoint.metadata.MetadataIndex",
      "torch.distributed.checkpoint.metadata.StorageMeta",
      "torch.distributed.checkpoint.metadata.TensorProperties",
      "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
      "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
  };
  if (kClasses.contains(name)) return true;
  return std::any_of(kTorchDtypes.begin(), kTorchDtypes.end(),
                     [&](const TorchDtype& d) { return d.name == name; });
}

class Reader {
 public:
  explicit Reader(const std::string& file) : file_(file) {}
  [[noreturn]] void fail(const std::string& name, const std::string& why) const {
    throw CheckpointError(file_, name, why);
  }
  const PickleValue& field(const PickleValue& v, std::string_view key, const std::string& name) {
    const PickleValue* f = v.get(key);
    if (f == nullptr) fail(name, fmt::format("no '{}' where .metadata should have one", key));
    return *f;
  }
  // torch.Size((...)) or a plain tuple of non-negative ints.
  std::vector<std::uint64_t> sizes(const PickleValue& v, const std::string& name) {
    const PickleValue* t = &v;
    if (v.is_class("torch.Size") && v.args->items.size() == 1) t = v.args->items[0].get();
    if (t->kind != Kind::kTuple) fail(name, "a size that is not a tuple");
    std::vector<std::uint64_t> out;
    for (const PickleRef& i : t->items) {
      if (i->kind != Kind::kInt || i->integer < 0) fail(name, "a size that is not a count");
      out.push_back(static_cast<std::uint64_t>(i->integer));
    }
    return out;
  }
  std::uint64_t count(const PickleValue& v, const std::string& name) {
    if (v.kind != Kind::kInt || v.integer < 0)
      fail(name, "an offset or length that is not a count");
    return static_cast<std::uint64_t>(v.integer);
  }
  std::string text(const PickleValue& v, const std::string& name) {
    if (v.kind != Kind::kStr) fail(name, "a name that is not a string");
    return v.text;
  }

  DcpTensorMeta tensor(std::string name, const PickleValue& v) {
    DcpTensorMeta t;
    t.name = std::move(name);
    const PickleValue& props = field(v, "properties", t.name);
    // TensorProperties pickles its state as (dtype, layout, requires_grad, memory_format, pin).
    const PickleValue* state = props.state.get();
    const PickleValue* dtype = props.get("dtype");
    if (dtype == nullptr && state && state->kind == Kind::kTuple && !state->items.empty()) {
      dtype = state->items[0].get();
    }
    if (dtype == nullptr || dtype->kind != Kind::kClass) fail(t.name, "no dtype in its properties");
    auto d = std::find_if(kTorchDtypes.begin(), kTorchDtypes.end(),
                          [&](const TorchDtype& x) { return x.name == dtype->text; });
    if (d == kTorchDtypes.end())
      fail(t.name, fmt::format("dtype {} is not supported", dtype->text));
    t.dtype = d->dtype;
    t.shape = sizes(field(v, "size", t.name), t.name);
    const PickleValue& chunks = field(v, "chunks", t.name);
    if (chunks.kind != Kind::kList) fail(t.name, "chunks that are not a list");
    for (const PickleRef& c : chunks.items) {
      DcpChunk chunk;
      chunk.offsets = sizes(field(*c, "offsets", t.name), t.name);
      chunk.sizes = sizes(field(*c, "sizes", t.name), t.name);
      t.chunks.push_back(std::move(chunk));
    }
    return t;
  }

  DcpMetadata parse(std::string_view bytes) {
    const PickleRef root = read_pickle(bytes, metadata_class_allowed, file_);
    if (!root->is_class(std::string(kMeta) + "Metadata")) fail("", "does not hold a DCP Metadata");
    if (const PickleValue* version = root->get("version"); version && version->kind == Kind::kStr) {
      // 1.x is what torch 2.x writes; a later major version may change what the fields mean.
      if (!version->text.starts_with("1.") && version->text != "1") {
        fail("", fmt::format("DCP metadata version {}, newer than the 1.x this reader knows",
                             version->text));
      }
    }
    DcpMetadata out;
    std::map<std::string, std::size_t> by_name;
    const PickleValue& sd = field(*root, "state_dict_metadata", "");
    if (sd.kind != Kind::kDict) fail("", "state_dict_metadata is not a dict");
    for (std::size_t i = 0; i + 1 < sd.items.size(); i += 2) {
      std::string name = text(*sd.items[i], "");
      const PickleValue& item = *sd.items[i + 1];
      if (item.is_class(std::string(kMeta) + "BytesStorageMetadata")) {
        out.byte_items.push_back(std::move(name));
      } else if (item.is_class(std::string(kMeta) + "TensorStorageMetadata")) {
        if (!by_name.emplace(name, out.tensors.size()).second) fail(name, "listed twice");
        out.tensors.push_back(tensor(std::move(name), item));
      } else {
        fail(name, "an item neither a tensor nor bytes");
      }
    }
    const PickleValue& storage = field(*root, "storage_data", "");
    if (storage.kind != Kind::kDict) fail("", "storage_data is not a dict");
    for (std::size_t i = 0; i + 1 < storage.items.size(); i += 2) {
      const PickleValue& index = *storage.items[i];
      const PickleValue& info = *storage.items[i + 1];
      const std::string name = text(field(index, "fqn", ""), "");
      auto it = by_name.find(name);
      if (it == by_name.end()) continue;  // a byte item's storage
      DcpTensorMeta& t = out.tensors[it->second];
      const std::vector<std::uint64_t> at = sizes(field(index, "offset", name), name);
      auto chunk = std::find_if(t.chunks.begin(), t.chunks.end(),
                                [&](const DcpChunk& c) { return c.offsets == at; });
      if (chunk == t.chunks.end()) fail(name, "storage_data names a chunk it does not list");
      chunk->relative_path = text(field(info, "relative_path", name), name);
      chunk->offset = count(field(info, "offset", name), name);
      chunk->length = count(field(info, "length", name), name);
    }
    for (const DcpTensorMeta& t : out.tensors) {
      for (const DcpChunk& c : t.chunks) {
        if (c.relative_path.empty()) fail(t.name, "a chunk with no place in storage_data");
      }
    }
    return out;
  }

 private:
  const std::string& file_;
};

}  // namespace

bool is_dcp_folder(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::exists(path / ".metadata", ec);
}

DcpMetadata parse_dcp_metadata(std::string_view bytes, const std::string& file) {
  return Reader(file).parse(bytes);
}

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

DcpFolder open_dcp_folder(const fs::path& dir, const FileOptions& options) {
  const fs::path meta_path = dir / ".metadata";
  File meta(meta_path, "r", options);
  std::string bytes(meta.size(), '\0');
  if (!bytes.empty() && meta.read(bytes.data(), bytes.size(), 0) != bytes.size()) {
    throw CheckpointError(meta.path(), "", "the file ended early");
  }
  const DcpMetadata md = parse_dcp_metadata(bytes, meta.path());
  DcpFolder out;
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
  for (const DcpTensorMeta& t : md.tensors) {
    const std::uint64_t element = dtype_bits(t.dtype) / 8;
    unsigned __int128 nbytes = element, covered = 0;
    for (std::uint64_t extent : t.shape) nbytes *= extent;
    std::vector<TensorPiece> pieces;
    for (const DcpChunk& c : t.chunks) {
      const std::size_t k = shard(c.relative_path, t.name);
      File& file = *out.files[k];
      if (c.offset > file.size() || c.length > file.size() - c.offset) {
        throw CheckpointError(file.path(), t.name,
                              fmt::format("its chunk at offset {} (+{} B) passes the file's end "
                                          "at {} B: truncated",
                                          c.offset, c.length, file.size()));
      }
      const TorchTensorRecord record = read_torch_save_tensor(
          [&](std::uint64_t at, std::uint64_t n) {
            std::string b(n, '\0');
            b.resize(n == 0 ? 0 : file.read(b.data(), n, at));
            return b;
          },
          c.offset, c.length, file.path());
      std::vector<TensorPiece> placed = place_chunk(t, c, record, k, file.path());
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
