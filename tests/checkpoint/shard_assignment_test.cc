// save_checkpoint's split into shards and its index, case by case against what huggingface_hub's
// split_torch_state_dict_into_shards and transformers' save_pretrained give for the same sizes
// (worked by hand from the rules in src/checkpoint/shard_assignment.cc).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/checkpoint_writer.h"

namespace ferry {
namespace {

struct Entry {
  std::uint64_t nbytes;
  std::uint64_t storage = 0;
  std::uint64_t storage_bytes = 0;  // 0: nbytes
};

struct Case {
  const char* what;
  std::uint64_t max_shard_size;
  std::vector<Entry> tensors;
  std::vector<std::size_t> shard;  // expected, per tensor
  std::uint64_t total_size;
};

// U8 tensors of `nbytes` elements each (no memory: the split reads only sizes and storages).
std::vector<TensorSource> sources(const std::vector<Entry>& entries) {
  std::vector<TensorSource> out;
  for (const Entry& e : entries) {
    TensorSource t;
    t.name = "t" + std::to_string(out.size());
    t.shape = {e.nbytes};
    t.nbytes = e.nbytes;
    t.storage = e.storage;
    t.storage_bytes = e.storage_bytes;
    out.push_back(t);
  }
  return out;
}

std::size_t count_of(const std::vector<std::size_t>& shard) {
  std::size_t n = 0;
  for (std::size_t s : shard) n = std::max(n, s + 1);
  return n;
}

TEST(AssignShards, MatchesHuggingfaceHubsSplitCaseByCase) {
  const std::vector<Case> cases = {
      {"an oversized tensor first", 8, {{10}, {4}, {4}, {4}}, {0, 1, 1, 2}, 22},
      // The big tensor's shard is finished at once; the open shard goes on after it.
      {"an oversized tensor mid-stream", 8, {{4}, {10}, {4}}, {1, 0, 1}, 18},
      {"an oversized tensor after a finished shard",
       8,
       {{4}, {4}, {4}, {10}, {1}, {1}},
       {0, 0, 2, 1, 2, 2},
       24},
      {"an oversized tensor last", 8, {{4}, {4}, {10}}, {1, 1, 0}, 18},
      {"a tensor of exactly the limit fits", 8, {{8}, {8}}, {0, 1}, 16},
      {"shards filled exactly", 8, {{4}, {4}, {4}, {4}}, {0, 0, 1, 1}, 16},
      {"one byte past the limit starts a shard", 8, {{3}, {5}, {1}}, {0, 0, 1}, 9},
      {"one byte past the limit alone is oversized", 8, {{9}}, {0}, 9},
      {"every tensor oversized", 8, {{9}, {10}, {11}}, {0, 1, 2}, 30},
      {"one shard in total under a limit", 100, {{1}, {2}, {3}}, {0, 0, 0}, 6},
      {"no limit: one shard", 0, {{1}, {20}, {300}}, {0, 0, 0}, 321},
      {"empty tensors never start a shard", 8, {{8}, {0}, {0}}, {0, 0, 0}, 8},
      {"an empty tensor before an oversized one", 8, {{0}, {9}}, {1, 0}, 9},
      // Later tensors of a storage join the first one's shard and add nothing to total_size.
      {"views of one storage stay together", 8, {{4, 1}, {4}, {4, 1}, {4}}, {0, 0, 0, 1}, 12},
      // A view is sized by its whole storage, as huggingface_hub sizes it: here 12 bytes, over
      // the limit, so the first view is a shard of its own (found against huggingface_hub on the
      // GPU machine: sized by its own 4 bytes it shared the first shard).
      {"a view is sized by its storage", 8, {{4, 1, 12}, {4}, {4, 1, 12}, {4}}, {0, 1, 0, 1}, 20},
      {"a view follows an oversized first", 8, {{10, 7}, {4}, {2, 7}}, {0, 1, 0}, 14},
      {"views are not sized", 8, {{4, 3}, {4, 3}, {4, 3}, {4}}, {0, 0, 0, 0}, 8},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::vector<TensorSource> tensors = sources(c.tensors);
    const ShardAssignment a = assign_shards(tensors, c.max_shard_size);
    EXPECT_EQ(a.shard, c.shard);
    EXPECT_EQ(a.count, count_of(c.shard));
    EXPECT_EQ(a.total_size, c.total_size);
  }
}

TEST(AssignShards, TotalParametersCountsEveryTensorsElements) {
  std::vector<TensorSource> tensors(3);
  tensors[0] = {"w", Dtype::kF32, {2, 3}, nullptr, 24};
  tensors[1] = {"scalar", Dtype::kF32, {}, nullptr, 4};
  tensors[2] = {"view", Dtype::kBF16, {5}, nullptr, 10};
  tensors[2].storage = tensors[0].storage = 1;  // a view: no bytes counted, its elements are
  const ShardAssignment a = assign_shards(tensors, 0);
  EXPECT_EQ(a.total_parameters, 6u + 1u + 5u);
  EXPECT_EQ(a.total_size, 28u);
  EXPECT_EQ(a.count, 1u);
}

TEST(AssignShards, NamesShardsAsTransformersDoes) {
  EXPECT_EQ(shard_file_name(0, 3), "model-00001-of-00003.safetensors");
  EXPECT_EQ(shard_file_name(2, 3), "model-00003-of-00003.safetensors");
  EXPECT_EQ(shard_file_name(0, 1), "model.safetensors");
}

// Expected: Python's json.dumps(index, indent=2, sort_keys=True) + "\n" of the same index.
TEST(CheckpointIndexJson, IsWhatTransformersWritesKeysSortedAndAsciiEscaped) {
  std::vector<TensorSource> tensors(3);
  tensors[0] = {"b", Dtype::kF32, {2, 3}, nullptr, 24};
  tensors[1] = {"a", Dtype::kF32, {}, nullptr, 4};
  tensors[2] = {"\xc3\xa9\x7f\xf0\x9f\x98\x80", Dtype::kU8, {0}, nullptr, 0};
  ShardAssignment a;
  a.shard = {1, 0, 0};
  a.count = 2;
  a.total_size = 28;
  a.total_parameters = 7;
  EXPECT_EQ(checkpoint_index_json(tensors, a, {shard_file_name(0, 2), shard_file_name(1, 2)}),
            "{\n"
            "  \"metadata\": {\n"
            "    \"total_parameters\": 7,\n"
            "    \"total_size\": 28\n"
            "  },\n"
            "  \"weight_map\": {\n"
            "    \"a\": \"model-00001-of-00002.safetensors\",\n"
            "    \"b\": \"model-00002-of-00002.safetensors\",\n"
            "    \"\\u00e9\\u007f\\ud83d\\ude00\": \"model-00001-of-00002.safetensors\"\n"
            "  }\n"
            "}\n");
}

}  // namespace
}  // namespace ferry
