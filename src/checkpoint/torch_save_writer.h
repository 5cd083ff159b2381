// The bytes of a torch.save blob of one tensor around the tensor's own bytes, so that those go to
// the file through ferry's write path (from GPU or host memory) and only the small zip records
// are made here. The blob is the zip torch.save writes, entries stored: archive/data.pkl (the
// tensor: a storage of `cpu` location, offset 0, contiguous strides), archive/byteorder,
// archive/data/0 (the bytes) and archive/version; zip64 where a size or offset needs it. Pure
// functions; thread-safe. The reading side is torch_save_blob.h.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/checkpoint.h"

namespace ferry::checkpoint {

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
