// DCP's format, as torch 2.11's FileSystemWriter writes it (tests/data/dcp holds stock output):
// `.metadata` pickles Metadata(state_dict_metadata={fqn: TensorStorageMetadata(properties,
// size, chunks) | BytesStorageMetadata()}, storage_data={MetadataIndex(fqn, offset, index):
// _StorageInfo(relative_path, offset, length)}, storage_meta, version); each tensor chunk is a
// whole torch.save blob at [offset, offset + length) of its file. A chunk's MetadataIndex.offset
// is the chunk's offsets, which is how the two dicts are joined.
#include "checkpoint/dcp_metadata.h"

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

}  // namespace ferry::checkpoint
