// The zip records of torch.save around the storages' own bytes, so that those go to the file
// through ferry's write path (from GPU or host memory) and only the small records are made here:
// the zip of any set of entries (torch_zip_layout, for ferry.torch.save), and a blob of one tensor
// (torch_save_blob, for DCP). The blob is the zip torch.save writes, entries stored:
// archive/data.pkl (the tensor: a storage of `cpu` location, offset 0, contiguous strides),
// archive/byteorder, archive/data/0 (the bytes) and archive/version; zip64 where a size or offset
// needs it. Pure functions; thread-safe. The reading side is torch_save_blob.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/checkpoint.h"

namespace ferry::checkpoint {

// One entry of the zip, stored: `bytes` (a small record, made here), or with `external` a
// storage of `size` bytes that the caller writes at the entry's data offset.
struct ZipEntry {
  std::string name;  // "archive/data.pkl"
  std::string bytes;
  bool external = false;
  std::uint64_t size = 0;        // an external entry's bytes
  std::uint64_t alignment = 64;  // of its data in the file: a power of two, at most 32768
};

struct ZipPiece {
  std::uint64_t offset = 0;  // in the file
  std::string bytes;
};

struct ZipLayout {
  // Every byte of the zip but the external entries' own: the records between them, in order.
  std::vector<ZipPiece> pieces;
  std::vector<std::uint64_t> data_offset;  // per entry, in the file
  std::uint64_t length = 0;                // of the zip
};

// The zip of `entries`, in that order, placed at `base_offset` of its file: local headers that
// carry their sizes and pad the data to its alignment (torch's "FB" extra field), the central
// directory, zip64 where a size or offset needs it. External entries' CRC-32 is written as 0.
ZipLayout torch_zip_layout(std::span<const ZipEntry> entries, std::uint64_t base_offset);

struct TorchSaveBlob {
  std::string head;               // at the blob's offset: every record before the tensor's bytes
  std::uint64_t data_offset = 0;  // in the file: where the tensor's bytes go
  std::string tail;               // at data_offset + nbytes: the rest, central directory last
  std::uint64_t length = 0;       // of the whole blob
};

// The blob of a contiguous tensor of `dtype` and `shape` (nbytes = product x element size),
// placed at `blob_offset` of its file, its bytes starting at a multiple of `alignment` (a power of
// two, at most 32768) of the file, as O_DIRECT and cuFile want. Throws CheckpointError naming
// `name` for a dtype torch.save has no storage class for.
TorchSaveBlob torch_save_blob(const std::string& name, Dtype dtype,
                              std::span<const std::uint64_t> shape, std::uint64_t blob_offset,
                              std::uint64_t alignment);

// The torch storage class of `dtype` ("FloatStorage"), empty where there is none.
std::string torch_storage_class(Dtype dtype);

}  // namespace ferry::checkpoint
