// Saving safetensors checkpoints from GPU or host memory: one file (save_file) or a directory of
// shards with model.safetensors.index.json (save_checkpoint). Each shard is written by one
// gathered request, durably and atomically by default (docs/checkpoints.md, "Saving"). The
// functions are thread-safe; the tensors' memory must stay unchanged until they return.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/checkpoint.h"
#include "ferry/file.h"
#include "ferry/route.h"

namespace ferry {

// One tensor to save: its bytes are `nbytes` at `data` (host or GPU memory; null when empty),
// laid out row-major and little-endian as the format stores them.
struct TensorSource {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<std::uint64_t> shape;  // empty: a scalar
  const void* data = nullptr;
  std::uint64_t nbytes = 0;
  // Tensors with the same nonzero `storage` are views of one block of memory (a torch storage:
  // device, address and size). save_checkpoint puts them all in the shard of the first of them,
  // as huggingface_hub's splitter does (assign_shards). 0: a block of its own.
  std::uint64_t storage = 0;
  // The bytes of that whole block, which huggingface_hub sizes a tensor by (the first of its
  // storage): a view of a larger storage counts as the storage. 0: `nbytes`, the tensor's own.
  std::uint64_t storage_bytes = 0;
};

// The safetensors header of a set of tensors: the 8-byte length, the JSON padded with spaces to a
// multiple of 8, then where each tensor's bytes go.
struct SafetensorsLayout {
  std::string header;                 // the file's first bytes, up to the data section
  std::vector<std::size_t> order;     // indices into the tensors, in the order of their bytes
  std::vector<std::uint64_t> offset;  // per tensor (as given): its first byte in the file
  std::uint64_t file_size = 0;
};

// The layout safetensors 0.8 writes for `tensors` and `metadata` (nullopt: no "__metadata__";
// an empty map: an empty one). Throws CheckpointError naming `file` and the tensor at fault:
// a duplicate name (or "__metadata__"), nbytes not matching shape x dtype, a header above 100 MB.
SafetensorsLayout safetensors_layout(
    std::span<const TensorSource> tensors,
    const std::optional<std::map<std::string, std::string>>& metadata,
    const std::string& file = "<memory>");

struct SaveOptions {
  std::optional<std::map<std::string, std::string>> metadata;  // each shard's "__metadata__"
  // fsync each file and its folder before it counts as saved. false: renames still make each
  // file appear whole, but a power loss may lose what the page cache held.
  bool durable = true;
  // save_checkpoint: the most bytes of tensor data in one shard (0: one shard). A tensor larger
  // than this gets a shard of its own (assign_shards says where it goes).
  std::uint64_t max_shard_size = 0;
  FileOptions file;          // settings of the writes (task_size, compat...)
  ProgressOptions progress;  // total: the bytes of every shard (the index is not counted)
};

struct SaveReport {
  std::vector<std::string> files;  // every file written, the index last
  std::uint64_t bytes = 0;         // file bytes written (headers, data, index)
  std::size_t tensors = 0;
  double seconds = 0;               // from the call until the last file was in place (and synced)
  std::vector<RouteReport> routes;  // one per gathered request
  std::size_t fsyncs = 0;           // of files and folders (save_file, ferry.torch.save)
  std::string summary() const;
};

// Writes `tensors` to `file` in the safetensors format. The file appears complete under its name
// or not at all: the bytes go to a temporary file beside it (.NAME.ferry-PID-XXXXXX), which is
// fsynced, renamed over `file`, and the folder fsynced. On any failure the temporary file is
// removed and `file` is left as it was; errors (IoError, CheckpointError) name `file`.
SaveReport save_file(std::span<const TensorSource> tensors, const std::filesystem::path& file,
                     const SaveOptions& options = {});

// The name of shard `index` (0-based) of `count`, as transformers writes it:
// model-00001-of-00003.safetensors; model.safetensors when count is 1.
std::string shard_file_name(std::size_t index, std::size_t count);

// Which shard each tensor goes to, and the totals of the index: the split huggingface_hub's
// split_torch_state_dict_into_shards makes for transformers' save_pretrained, restated in
// src/checkpoint/shard_assignment.cc (docs/checkpoints.md, "Sharded saves").
struct ShardAssignment {
  std::vector<std::size_t> shard;  // per tensor (as given): its shard, 0-based
  std::size_t count = 0;           // shards (0 only for no tensors)
  // The index's metadata.total_size: the bytes of each storage's first tensor (a tensor whose
  // storage came before adds nothing), as huggingface_hub counts it.
  std::uint64_t total_size = 0;
  // The index's metadata.total_parameters: the elements of every tensor (the product of its
  // shape; a scalar is 1), transformers' num_parameters() for a state dict of parameters only.
  std::uint64_t total_parameters = 0;
};

// The split of `tensors` (in the order given) under max_shard_size (0: no limit, one shard).
ShardAssignment assign_shards(std::span<const TensorSource> tensors, std::uint64_t max_shard_size);

// model.safetensors.index.json as transformers writes it for `tensors` split by `assignment`,
// shard k named `file_names[k]`: json.dumps(index, indent=2, sort_keys=True) and a newline.
std::string checkpoint_index_json(std::span<const TensorSource> tensors,
                                  const ShardAssignment& assignment,
                                  const std::vector<std::string>& file_names);

// Writes `tensors` into `directory` (created if missing) as shards and
// model.safetensors.index.json (always, even for one shard), replacing a checkpoint already
// there so that a reader, or a crash at any moment, sees the old checkpoint or the new one whole:
// the index is written last, and no shard an index names is replaced while that index is in
// place. Files of the old checkpoint that the new one does not use are removed at the end.
SaveReport save_checkpoint(std::span<const TensorSource> tensors,
                           const std::filesystem::path& directory, const SaveOptions& options = {});

}  // namespace ferry
