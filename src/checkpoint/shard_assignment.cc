// How save_checkpoint cuts tensors into shards and what its index says: the one place ferry
// decides it (Python passes its rows through). Pure functions, thread-safe.
//
// The contract, learned from the sources and restated here (docs/checkpoints.md has the user's
// view):
//
// transformers' save_pretrained (src/transformers/modeling_utils.py, read at commit 040ba146,
// the v5 line; v4 has called the same splitter since PR #31091, 2024) drops tied duplicates from
// the state dict first (remove_tied_weights_from_state_dict), then asks huggingface_hub's
// split_torch_state_dict_into_shards (src/huggingface_hub/serialization/_torch.py at 04d18e63,
// over split_state_dict_into_shards_factory in _base.py at 122aa5cc) for the split:
//  - The tensors are taken in the dict's order. A tensor's size is its storage's
//    (get_torch_storage_size: untyped_storage().nbytes()), which is numel * element_size for a
//    tensor that owns its storage and more for a view of a larger one. (Found on the GPU
//    machine's huggingface_hub: sizing views by their own bytes split differently.)
//  - A tensor strictly larger than max_shard_size becomes a shard of its own, appended to the
//    list of finished shards at once; the shard being filled stays open, so the small tensors
//    around the big one end up together in a later shard. A tensor of exactly max_shard_size
//    fits.
//  - Otherwise, when the open shard's size plus the tensor's would pass max_shard_size, the open
//    shard is finished (appended) and a new one begins. An open shard that would be finished is
//    never empty (its size is then above 0), so no shard is empty.
//  - After the loop the open shard, if it holds anything, is the last one.
//  - Storage: get_torch_storage_id is (device, storage data pointer, storage bytes). The second
//    and later tensors of one storage are not sized and not counted; they join the shard of the
//    first one after the split. All empty CPU tensors share (cpu, 0, 0), so they go together.
//  - metadata.total_size is the sum of the sizes of the tensors that were sized (each storage's
//    first tensor), big ones included.
//  - Names: model-{k:05d}-of-{n:05d}.safetensors, k from 1; with one shard model.safetensors,
//    and is_sharded is false: save_pretrained then writes no index at all.
// With several shards, save_pretrained writes model.safetensors.index.json as
// json.dumps({"metadata": {"total_parameters": self.num_parameters(), **split.metadata},
// "weight_map": split.tensor_to_filename}, indent=2, sort_keys=True) + "\n". total_parameters came
// with transformers PR #38531 (merged 2025-06-02, in releases from 4.53.0); num_parameters()
// counts the elements of the model's parameters, each once, without buffers. json.dumps keeps
// ensure_ascii, so a non-ASCII name is written as \uXXXX escapes (surrogate pairs above U+FFFF).
#include <fmt/format.h>

#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "ferry/checkpoint_writer.h"

namespace ferry {

std::string shard_file_name(std::size_t index, std::size_t count) {
  if (count == 1) return "model.safetensors";
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

ShardAssignment assign_shards(std::span<const TensorSource> tensors, std::uint64_t max_shard_size) {
  const std::uint64_t limit =
      max_shard_size == 0 ? std::numeric_limits<std::uint64_t>::max() : max_shard_size;
  ShardAssignment a;
  a.shard.assign(tensors.size(), 0);
  std::vector<std::vector<std::size_t>> finished;  // shards in the order they were finished
  std::vector<std::size_t> open;
  std::uint64_t filled = 0;                    // never above limit
  std::map<std::uint64_t, std::size_t> first;  // storage -> its first tensor
  std::vector<std::size_t> followers;          // tensors whose storage came before
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorSource& t = tensors[i];
    std::uint64_t elements = 1;
    for (std::uint64_t d : t.shape) elements *= d;
    a.total_parameters += elements;
    if (t.storage != 0 && !first.emplace(t.storage, i).second) {
      followers.push_back(i);
      continue;
    }
    const std::uint64_t size = t.storage_bytes != 0 ? t.storage_bytes : t.nbytes;
    a.total_size += size;
    if (size > limit) {
      finished.push_back({i});
      continue;
    }
    if (size > limit - filled) {
      finished.push_back(std::move(open));
      open.clear();
      filled = 0;
    }
    open.push_back(i);
    filled += size;
  }
  if (!open.empty()) finished.push_back(std::move(open));
  for (std::size_t s = 0; s < finished.size(); ++s) {
    for (std::size_t i : finished[s]) a.shard[i] = s;
  }
  for (std::size_t i : followers) a.shard[i] = a.shard[first.at(tensors[i].storage)];
  a.count = finished.size();
  return a;
}

std::string checkpoint_index_json(std::span<const TensorSource> tensors,
                                  const ShardAssignment& assignment,
                                  const std::vector<std::string>& file_names) {
  // nlohmann's objects keep their keys sorted (by bytes: for UTF-8, the code point order of
  // Python's sort_keys), and dump(2, ' ', true) escapes as json.dumps(ensure_ascii=True) does.
  nlohmann::json map = nlohmann::json::object();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    map[tensors[i].name] = file_names.at(assignment.shard.at(i));
  }
  const nlohmann::json index = {
      {"metadata",
       {{"total_parameters", assignment.total_parameters}, {"total_size", assignment.total_size}}},
      {"weight_map", map}};
  return index.dump(2, ' ', true) + "\n";
}

}  // namespace ferry
