// Checkpoint: shard discovery (file, index, directory), the index checked against the shards,
// and loads into host memory compared byte for byte with what the tests' writer put there.
#include "ferry/checkpoint.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors_writer.h"
#include "test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using test::safetensors_bytes;
using test::TempDir;
using test::write_file;
using test::WrittenTensor;

// The read route: these tests are about its requests and allocations (host_route_test.cc has the
// mapped one, which a file just written, resident in the page cache, would take).
LoadOptions host(std::vector<std::string> names = {}, bool one = false) {
  LoadOptions o;
  o.memory = MemoryKind::kHostPageable;
  o.host_load = HostLoad::kRead;
  o.names = std::move(names);
  o.one_allocation = one;
  return o;
}

std::vector<WrittenTensor> mixed(unsigned seed) {
  return {{"embed.weight", "BF16", {16, 8}, test::pattern(256, seed)},
          {"layer.0.scale", "F32", {}, test::pattern(4, seed + 1)},
          {"layer.0.empty", "F16", {0, 3}, ""},
          {"layer.0.q", "F8_E4M3", {7, 3}, test::pattern(21, seed + 2)},
          {"layer.0.ids", "I64", {5}, test::pattern(40, seed + 3)},
          {"layer.0.mask", "BOOL", {3}, std::string("\1\0\1", 3)},
          {"layer.0.packed", "F4", {6}, test::pattern(3, seed + 4)}};
}

void expect_loaded(const LoadResult& r, const std::vector<WrittenTensor>& written) {
  for (const WrittenTensor& w : written) {
    auto it = std::find_if(r.tensors.begin(), r.tensors.end(),
                           [&](const LoadedTensor& t) { return t.name == w.name; });
    ASSERT_NE(it, r.tensors.end()) << w.name;
    EXPECT_EQ(to_string(it->dtype), w.dtype);
    EXPECT_EQ(it->shape, w.shape);
    ASSERT_EQ(it->nbytes, w.bytes.size()) << w.name;
    if (!w.bytes.empty()) {
      EXPECT_EQ(std::memcmp(it->data, w.bytes.data(), w.bytes.size()), 0) << w.name;
    }
  }
}

TEST(Checkpoint, OneFileLoadsEveryTensorByteForByte) {
  TempDir dir;
  auto written = mixed(1);
  write_file(dir / "model.safetensors", safetensors_bytes(written, {{"format", "pt"}}));
  Checkpoint ckpt(dir / "model.safetensors");
  ASSERT_EQ(ckpt.shards().size(), 1u);
  EXPECT_EQ(ckpt.tensors().size(), written.size());
  EXPECT_EQ(ckpt.metadata(0).at("format"), "pt");
  EXPECT_EQ(ckpt.index_metadata_json(), "{}");
  LoadResult r = ckpt.load(host());
  EXPECT_EQ(r.tensors.size(), written.size());
  expect_loaded(r, written);
  EXPECT_EQ(r.report.bytes, ckpt.total_bytes());
  EXPECT_EQ(r.report.tensors, written.size());
  ASSERT_EQ(r.report.routes.size(), 1u);  // one gathered request for the whole shard
  EXPECT_EQ(r.report.routes[0].bytes, ckpt.total_bytes());
  EXPECT_NE(r.report.summary().find("7 tensors"), std::string::npos) << r.report.summary();
  // The allocations are timed inside the load's own clock.
  EXPECT_GT(r.report.allocate_seconds, 0.0);
  EXPECT_LE(r.report.allocate_seconds, r.report.seconds);
  auto json = nlohmann::json::parse(r.report.to_json());
  EXPECT_EQ(json["bytes"], ckpt.total_bytes());
  EXPECT_EQ(json["routes"].size(), 1u);
  EXPECT_EQ(json["allocate_seconds"], r.report.allocate_seconds);
}

TEST(Checkpoint, OneAllocationHoldsAlignedTensors) {
  TempDir dir;
  auto written = mixed(2);
  write_file(dir / "m.safetensors", safetensors_bytes(written));
  LoadResult r = Checkpoint(dir / "m.safetensors").load(host({}, true));
  ASSERT_EQ(r.memory.size(), 1u);
  for (const LoadedTensor& t : r.tensors) {
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data) % 256, 0u) << t.name;
  }
  expect_loaded(r, written);
}

TEST(Checkpoint, TheCallersAllocatorGivesTheMemoryInLoadOrder) {
  // Python's loader is this one, with torch, NumPy or CuPy memory (issue 46).
  TempDir dir;
  auto written = mixed(3);
  write_file(dir / "m.safetensors", safetensors_bytes(written));
  Checkpoint ckpt(dir / "m.safetensors");
  for (bool one : {false, true}) {
    std::vector<std::vector<char>> given;
    LoadOptions o = host({}, one);
    o.allocate = [&](std::uint64_t bytes) { return given.emplace_back(bytes).data(); };
    LoadResult r = ckpt.load(o);
    EXPECT_TRUE(r.memory.empty());
    ASSERT_EQ(given.size(), one ? 1u : written.size());
    expect_loaded(r, written);
    if (!one) {
      EXPECT_EQ(r.tensors[0].data, given[0].data());
    }
  }
  // One that gives nothing for a tensor with bytes is refused, naming the checkpoint.
  LoadOptions o = host();
  o.allocate = [](std::uint64_t) -> void* { return nullptr; };
  try {
    ckpt.load(o);
    ADD_FAILURE() << "a null allocation was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.safetensors: the allocator gave no memory for 256 B"),
              std::string::npos)
        << e.what();
  }
}

TEST(Checkpoint, ASubsetLoadsOnlyTheNamedTensors) {
  TempDir dir;
  auto written = mixed(3);
  write_file(dir / "m.safetensors", safetensors_bytes(written));
  Checkpoint ckpt(dir / "m.safetensors");
  LoadResult r = ckpt.load(host({"layer.0.ids", "embed.weight", "layer.0.ids"}));
  ASSERT_EQ(r.tensors.size(), 2u);
  EXPECT_EQ(r.tensors[0].name, "embed.weight");  // file order
  EXPECT_EQ(r.report.bytes, 256u + 40u);
  expect_loaded(r, {written[0], written[4]});
  try {
    ckpt.load(host({"nope"}));
    ADD_FAILURE() << "loaded a tensor that is not there";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.tensor(), "nope");
  }
}

// Writes `shards` as model-0000i-of-0000n.safetensors with transformers' index beside them.
void write_sharded(const TempDir& dir, const std::vector<std::vector<WrittenTensor>>& shards,
                   const std::string& index_name = "model.safetensors.index.json") {
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  for (std::size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_file(dir / name, safetensors_bytes(shards[i]));
    for (const WrittenTensor& t : shards[i]) index["weight_map"][t.name] = name;
  }
  write_file(dir / index_name, index.dump());
}

std::vector<std::vector<WrittenTensor>> three_shards() {
  std::vector<std::vector<WrittenTensor>> shards(3);
  for (unsigned i = 0; i < 12; ++i) {
    shards[i % 3].push_back({"layers." + std::to_string(i) + ".w",
                             i % 2 ? "F16" : "U32",
                             {4, i + 1},
                             test::pattern((i % 2 ? 2 : 4) * 4 * (i + 1), i)});
  }
  return shards;
}

TEST(Checkpoint, AnIndexLoadsEveryShardOneRequestEach) {
  TempDir dir;
  auto shards = three_shards();
  write_sharded(dir, shards);
  for (const auto& path : {dir / "model.safetensors.index.json", dir.path()}) {
    Checkpoint ckpt(path);
    EXPECT_EQ(ckpt.shards().size(), 3u);
    EXPECT_EQ(ckpt.tensors().size(), 12u);
    EXPECT_NE(ckpt.index_metadata_json().find("total_size"), std::string::npos);
    LoadResult r = ckpt.load(host());
    EXPECT_EQ(r.report.routes.size(), 3u);
    for (const auto& s : shards) expect_loaded(r, s);
  }
}

TEST(Checkpoint, ADirectoryWithoutIndexLoadsEveryShard) {
  TempDir dir;
  auto shards = three_shards();
  write_file(dir / "a.safetensors", safetensors_bytes(shards[0]));
  write_file(dir / "b.safetensors", safetensors_bytes(shards[1]));
  write_file(dir / "notes.txt", "not a shard");
  Checkpoint ckpt(dir.path());
  EXPECT_EQ(ckpt.shards().size(), 2u);
  LoadResult r = ckpt.load(host());
  expect_loaded(r, shards[0]);
  expect_loaded(r, shards[1]);
}

void expect_checkpoint_error(const std::filesystem::path& path, const std::string& tensor,
                             const std::string& words) {
  try {
    Checkpoint ckpt(path);
    ADD_FAILURE() << "opened " << path;
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.tensor(), tensor) << e.what();
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, AnIndexMustAgreeWithItsShards) {
  {
    TempDir dir;
    auto shards = three_shards();
    write_sharded(dir, shards);
    // The index names a tensor its shard does not hold.
    std::ifstream in(dir / "model.safetensors.index.json");
    auto index = nlohmann::json::parse(in);
    index["weight_map"]["ghost"] = "model-00001-of-00003.safetensors";
    write_file(dir / "model.safetensors.index.json", index.dump());
    expect_checkpoint_error(dir.path(), "ghost", "does not hold it");
  }
  {
    TempDir dir;
    auto shards = three_shards();
    write_sharded(dir, shards);
    nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
    index["weight_map"]["layers.0.w"] = "model-00001-of-00003.safetensors";
    write_file(dir / "model.safetensors.index.json", index.dump());
    // Shard 1 holds tensors the index does not list.
    expect_checkpoint_error(dir.path(), "layers.3.w", "not in the index");
  }
  {
    TempDir dir;
    write_file(dir / "model.safetensors.index.json",
               R"({"weight_map":{"w":"missing.safetensors"}})");
    expect_checkpoint_error(dir.path(), "w", "does not exist");
  }
  {
    TempDir dir;
    write_file(dir / "model.safetensors.index.json", R"({"metadata":{}})");
    expect_checkpoint_error(dir.path(), "", "no \"weight_map\"");
  }
}

TEST(Checkpoint, ATensorInTwoShardsIsRefused) {
  TempDir dir;
  write_file(dir / "a.safetensors", safetensors_bytes({{"w", "U8", {1}, "a"}}));
  write_file(dir / "b.safetensors", safetensors_bytes({{"w", "U8", {1}, "b"}}));
  expect_checkpoint_error(dir.path(), "w", "also in");
}

TEST(Checkpoint, NothingToLoadIsAClearError) {
  TempDir dir;
  expect_checkpoint_error(dir.path(), "", "no .safetensors file");
  expect_checkpoint_error(dir / "absent", "", "no such file or directory");
  write_file(dir / "short.safetensors", "abc");
  expect_checkpoint_error(dir / "short.safetensors", "", "too short");
}

TEST(Checkpoint, ReadIntoRefusesAMissingBuffer) {
  TempDir dir;
  write_file(dir / "m.safetensors",
             safetensors_bytes({{"w", "U8", {4}, "abcd"}, {"e", "U8", {0}, ""}}));
  Checkpoint ckpt(dir / "m.safetensors");
  TensorTarget empty{ckpt.find("e"), nullptr};
  EXPECT_EQ(ckpt.read_into({&empty, 1}).bytes, 0u);  // an empty tensor needs no buffer
  TensorTarget bad{ckpt.find("w"), nullptr};
  EXPECT_THROW(ckpt.read_into({&bad, 1}), CheckpointError);
  TensorTarget out_of_range{99, nullptr};
  EXPECT_THROW(ckpt.read_into({&out_of_range, 1}), Error);
  char two[2] = {};
  TensorTarget past{ckpt.find("w"), two, 3, 2};
  EXPECT_THROW(ckpt.read_into({&past, 1}), CheckpointError);
  TensorTarget middle{ckpt.find("w"), two, 1, 2};
  EXPECT_EQ(ckpt.read_into({&middle, 1}).bytes, 2u);
  EXPECT_EQ(std::string(two, 2), "bc");
}

// Issue 30, finding 7: an index could name any file (a path up and out, an absolute path, a
// symlink out of the folder), and the error then printed its first 8 bytes as a "header length".
TEST(Checkpoint, ShardsMustStayInsideTheCheckpointsFolder) {
  TempDir root;
  fs::create_directories(root / "model");
  fs::create_directories(root / "secret");
  write_file(root / "secret" / "x.safetensors", "SECRET!!and more secret text");
  const fs::path index = root / "model" / "model.safetensors.index.json";
  struct Case {
    std::string shard;
    std::string says;
  } cases[] = {
      {"../secret/x.safetensors", "leaves the checkpoint's folder"},
      {(root / "secret" / "x.safetensors").string(), "absolute path"},
      {"link.safetensors", "outside the checkpoint's folder"},
  };
  fs::create_symlink(root / "secret" / "x.safetensors", root / "model" / "link.safetensors");
  for (const Case& c : cases) {
    write_file(index, R"({"weight_map":{"w":")" + c.shard + R"("}})");
    try {
      Checkpoint ckpt(index);
      ADD_FAILURE() << "opened " << c.shard;
    } catch (const CheckpointError& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.tensor(), "w") << what;
      EXPECT_NE(what.find(c.says), std::string::npos) << what;
      EXPECT_EQ(what.find("SECRET"), std::string::npos) << what;
      EXPECT_EQ(what.find("2387281934192690515"), std::string::npos) << what;  // "SECRET!!"
    }
  }
  // Directory discovery follows the same rule.
  fs::remove(index);
  try {
    Checkpoint ckpt(root / "model");
    ADD_FAILURE() << "followed a symlink out of the folder";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("outside the checkpoint's folder"), std::string::npos)
        << e.what();
  }
  // A link that stays inside is a shard like any other.
  fs::remove(root / "model" / "link.safetensors");
  write_file(root / "model" / "real.bin", safetensors_bytes({{"w", "U8", {1}, "a"}}));
  fs::create_symlink("real.bin", root / "model" / "inside.safetensors");
  EXPECT_EQ(Checkpoint(root / "model").tensors().size(), 1u);
}

// Issue 30, finding 7: the 8 bytes of a file that is not a safetensors file are not printed.
TEST(Checkpoint, AFileThatIsNotSafetensorsDoesNotHaveItsBytesPrinted) {
  TempDir dir;
  write_file(dir / "x.safetensors", "root:x:0:0:root:/root:/bin/bash\n");
  try {
    Checkpoint ckpt(dir / "x.safetensors");
    ADD_FAILURE() << "opened a text file";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("3475222254926655346"), std::string::npos) << what;  // "root:x:0" as LE
    EXPECT_NE(what.find("header length"), std::string::npos) << what;
  }
}

// Issue 30, finding 16: limits and refusals of an index.
TEST(Checkpoint, AnIndexHasSizeAndDepthLimitsAndNoDuplicateOrEmptyOrDotEntries) {
  TempDir dir;
  write_file(dir / "a.safetensors", safetensors_bytes({{"w", "U8", {1}, "a"}}));
  const fs::path index = dir / "model.safetensors.index.json";
  auto refused = [&](const std::string& tensor, const std::string& says) {
    expect_checkpoint_error(index, tensor, says);
  };
  write_file(index, R"({"weight_map":{"w":"a.safetensors","w":"b.safetensors"}})");
  refused("w", "names \"w\" twice");
  write_file(index, R"({"weight_map":{}})");
  refused("", "index names no tensor");
  write_file(index, R"({"weight_map":{"w":"."}})");
  refused("w", "not a regular file");
  write_file(index, R"({"metadata":)" + std::string(20, '[') + std::string(20, ']') +
                        R"(,"weight_map":{"w":"a.safetensors"}})");
  refused("", "nests deeper than 16 levels");
  write_file(index, R"({"weight_map":{"w":"a.safetensors"}})" + std::string("\0x", 2));
  refused("", "NUL");
  {
    std::ofstream grow(index, std::ios::binary | std::ios::trunc);
    grow.seekp((64 << 20) + 1);
    grow.put(' ');
  }
  refused("", "above the 67108864 B limit");
  write_file(index, R"({"weight_map":{"w":"a.safetensors"}})");
  EXPECT_EQ(Checkpoint(index).tensors().size(), 1u);
}

// Issue 30, finding 16: a name in no shard blamed the first shard.
TEST(Checkpoint, ATensorInNoShardSaysSoAndNamesTheNearestNames) {
  TempDir dir;
  write_sharded(dir, three_shards());
  Checkpoint ckpt(dir.path());
  try {
    ckpt.find("layers.1.x");
    ADD_FAILURE() << "found a tensor that is not there";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.file(), dir.path().string()) << what;
    EXPECT_NE(what.find("is in no shard"), std::string::npos) << what;
    EXPECT_NE(what.find("'layers.1.w'"), std::string::npos) << what;
    EXPECT_EQ(what.find("model-00001"), std::string::npos) << what;
  }
}

// Issue 30, finding 16: every shard stayed open, so a checkpoint of more shards than the
// descriptor limit failed to open.
TEST(Checkpoint, MoreShardsThanTheDescriptorLimitOpenAndLoad) {
  TempDir dir;
  std::vector<std::vector<WrittenTensor>> shards(300);
  for (unsigned i = 0; i < shards.size(); ++i) {
    shards[i].push_back({"t." + std::to_string(i), "U8", {3}, test::pattern(3, i)});
  }
  write_sharded(dir, shards);
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  struct rlimit low = old;
  low.rlim_cur = 200;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  try {
    Checkpoint ckpt(dir.path());
    const LoadResult r = ckpt.load(host());
    EXPECT_EQ(r.report.tensors, 300u);
    EXPECT_EQ(r.report.routes.size(), 300u);
    for (const auto& s : shards) expect_loaded(r, s);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  setrlimit(RLIMIT_NOFILE, &old);
}

// Finding 7 of issue 45: the Hugging Face hub cache keeps a revision as links into ../../blobs,
// which safetensors and transformers load; ferry refused them as leaving the folder. Links that
// stay inside the cache's repository folder load; one leaving it is still refused.
TEST(Checkpoint, TheHubCachesSnapshotOfLinksIntoBlobsLoads) {
  TempDir root;
  const fs::path repo = root / "hub" / "models--org--tiny";
  const fs::path snapshot = repo / "snapshots" / "0123abcd";
  fs::create_directories(repo / "blobs");
  fs::create_directories(snapshot);
  auto shards = three_shards();
  for (int i = 0; i < 3; ++i) {
    const std::string blob = "b10b" + std::to_string(i);
    write_file(repo / "blobs" / blob, safetensors_bytes(shards[i]));
    fs::create_symlink("../../blobs/" + blob,
                       snapshot / ("model-0000" + std::to_string(i + 1) + "-of-00003.safetensors"));
  }
  std::string map;
  for (int i = 0; i < 3; ++i) {
    for (const auto& t : shards[i]) {
      map += (map.empty() ? "" : ",") + test::json_string(t.name) + ":\"model-0000" +
             std::to_string(i + 1) + "-of-00003.safetensors\"";
    }
  }
  write_file(repo / "blobs" / "1ndex", R"({"metadata":{},"weight_map":{)" + map + "}}");
  fs::create_symlink("../../blobs/1ndex", snapshot / "model.safetensors.index.json");
  for (const fs::path& path : {snapshot, snapshot / "model.safetensors.index.json"}) {
    Checkpoint ckpt(path);
    LoadResult r = ckpt.load(host());
    for (const auto& s : shards) expect_loaded(r, s);
  }
  // Without the index: the folder's links load too.
  fs::remove(snapshot / "model.safetensors.index.json");
  EXPECT_EQ(Checkpoint(snapshot).tensors().size(), 12u);
  // A link out of the repository's folder is refused.
  write_file(root / "hub" / "elsewhere.bin", safetensors_bytes(shards[0]));
  fs::remove(snapshot / "model-00001-of-00003.safetensors");
  fs::create_symlink("../../../elsewhere.bin", snapshot / "model-00001-of-00003.safetensors");
  expect_checkpoint_error(snapshot, "", "outside the checkpoint's hub cache folder");
}

// Finding 4 of issue 45: a save into a new folder stopped half-way left 2 of its shards and no
// index, and the folder loaded as a model with tensors missing, without a word.
TEST(Checkpoint, AFolderOfNumberedShardsWithOneMissingIsRefusedNamingIt) {
  TempDir dir;
  auto shards = three_shards();
  write_file(dir / "model-00001-of-00003.safetensors", safetensors_bytes(shards[0]));
  write_file(dir / "model-00003-of-00003.safetensors", safetensors_bytes(shards[2]));
  expect_checkpoint_error(dir.path(), "", "holds 2 of the 3 shards");
  expect_checkpoint_error(dir.path(), "", "model-00002-of-00003.safetensors");
  write_file(dir / "model-00002-of-00003.safetensors", safetensors_bytes(shards[1]));
  EXPECT_EQ(Checkpoint(dir.path()).tensors().size(), 12u);
}

// Every call a progress callback got: (done, total).
struct Calls {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> seen;
  ProgressOptions options() {
    ProgressOptions p;
    p.callback = [this](std::uint64_t done, std::uint64_t total) {
      seen.emplace_back(done, total);
    };
    p.interval_seconds = 0;  // every wait step: as many calls as the load gives
    return p;
  }
  // Done never goes down, the total never changes, and the last call is at `total`.
  void expect_finished_at(std::uint64_t total) const {
    ASSERT_FALSE(seen.empty());
    for (std::size_t i = 0; i < seen.size(); ++i) {
      EXPECT_EQ(seen[i].second, total) << i;
      if (i > 0) {
        EXPECT_GE(seen[i].first, seen[i - 1].first) << i;
      }
    }
    EXPECT_EQ(seen.back().first, total);
  }
};

TEST(CheckpointProgress, ALoadReportsEveryChosenByteOnceDoneNeverGoingDown) {
  TempDir dir;
  auto shards = three_shards();
  write_sharded(dir, shards);
  Checkpoint ckpt(dir.path());
  for (bool one : {false, true}) {
    Calls calls;
    LoadOptions o = host({}, one);
    o.progress = calls.options();
    LoadResult r = ckpt.load(o);
    calls.expect_finished_at(ckpt.total_bytes());
    for (const auto& s : shards) expect_loaded(r, s);
  }
  // A subset: the total is the named tensors' bytes.
  Calls calls;
  LoadOptions o = host({"layers.3.w", "layers.4.w"});
  o.progress = calls.options();
  ckpt.load(o);
  calls.expect_finished_at(ckpt.tensors()[ckpt.find("layers.3.w")].nbytes +
                           ckpt.tensors()[ckpt.find("layers.4.w")].nbytes);
}

TEST(CheckpointProgress, ReadIntoReportsTheTargetsBytes) {
  TempDir dir;
  auto written = mixed(3);
  write_file(dir / "model.safetensors", safetensors_bytes(written));
  Checkpoint ckpt(dir / "model.safetensors");
  const std::size_t k = ckpt.find("layer.0.ids");
  std::vector<char> buffer(16);
  const TensorTarget target{k, buffer.data(), 8, 16};
  Calls calls;
  ckpt.read_into(std::span(&target, 1), calls.options());
  calls.expect_finished_at(16);
  EXPECT_EQ(std::memcmp(buffer.data(), written[4].bytes.data() + 8, 16), 0);
}

TEST(CheckpointProgress, AnExceptionFromTheCallbackEndsTheLoadAndPropagates) {
  TempDir dir;
  write_sharded(dir, three_shards());
  Checkpoint ckpt(dir.path());
  int calls = 0;
  LoadOptions o = host();
  o.progress.callback = [&](std::uint64_t, std::uint64_t) {
    ++calls;
    throw std::runtime_error("stop the load");
  };
  o.progress.interval_seconds = 0;
  EXPECT_THROW(
      {
        try {
          ckpt.load(o);
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "stop the load");
          throw;
        }
      },
      std::runtime_error);
  EXPECT_EQ(calls, 1);  // never again once it threw
  // The checkpoint is as usable as before.
  o.progress = {};
  EXPECT_EQ(ckpt.load(o).report.bytes, ckpt.total_bytes());
}

}  // namespace
}  // namespace ferry
