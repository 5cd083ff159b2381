// Test support: a DCP `.metadata` pickle for tensors saved whole (one chunk each), shaped as
// torch 2.x pickles Metadata (each dataclass as NEWOBJ and a dict state), so that tests of ferry's
// DCP writing core can commit a folder without torch. In production the Python writer pickles
// torch's own Metadata (python/ferry/dcp.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/pickle_writer.h"

namespace ferry::test {

struct DcpEntry {
  std::string name;
  std::string torch_dtype;  // "uint8", "float32"...; empty: a byte item
  std::vector<std::uint64_t> shape;
  std::string relative_path;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};

inline std::string dcp_metadata_pickle(const std::vector<DcpEntry>& entries) {
  checkpoint::PickleWriter p;
  constexpr const char* kMeta = "torch.distributed.checkpoint.metadata";
  auto object = [&](const char* module, const char* cls) {
    p.global(module, cls);
    p.empty_tuple();
    p.new_object();
    p.empty_dict();
    p.mark();
  };
  auto done = [&] {
    p.set_items();
    p.build();
  };
  auto size = [&](const std::vector<std::uint64_t>& v, bool zeros) {
    p.global("torch", "Size");
    p.mark();
    p.mark();
    for (std::uint64_t x : v) p.integer(zeros ? 0 : static_cast<std::int64_t>(x));
    p.tuple();
    p.tuple();
    p.reduce();
  };
  object(kMeta, "Metadata");
  p.str("state_dict_metadata");
  p.empty_dict();
  p.mark();
  for (const DcpEntry& e : entries) {
    p.str(e.name);
    if (e.torch_dtype.empty()) {
      object(kMeta, "BytesStorageMetadata");
      done();
      continue;
    }
    object(kMeta, "TensorStorageMetadata");
    p.str("properties");
    object(kMeta, "TensorProperties");
    p.str("dtype");
    p.global("torch", e.torch_dtype);
    done();
    p.str("size");
    size(e.shape, false);
    p.str("chunks");
    p.empty_list();
    p.mark();
    object(kMeta, "ChunkStorageMetadata");
    p.str("offsets");
    size(e.shape, true);
    p.str("sizes");
    size(e.shape, false);
    done();
    p.appends();
    done();
  }
  p.set_items();
  p.str("storage_data");
  p.empty_dict();
  p.mark();
  for (const DcpEntry& e : entries) {
    object(kMeta, "MetadataIndex");
    p.str("fqn");
    p.str(e.name);
    p.str("offset");
    if (e.torch_dtype.empty()) {
      p.none();
    } else {
      size(e.shape, true);
    }
    p.str("index");
    p.integer(0);
    done();
    object("torch.distributed.checkpoint.filesystem", "_StorageInfo");
    p.str("relative_path");
    p.str(e.relative_path);
    p.str("offset");
    p.integer(static_cast<std::int64_t>(e.offset));
    p.str("length");
    p.integer(static_cast<std::int64_t>(e.length));
    done();
  }
  p.set_items();
  p.str("version");
  p.str("1.0.0");
  done();
  return p.finish();
}

}  // namespace ferry::test
