// Saving checkpoints: the header laid out byte for byte as safetensors 0.8 writes it (expected
// bytes computed by hand from its rules), round trips through ferry's loader, the atomic and
// durable file protocol, sharded saves with their index, and errors that name the file (a full
// tmpfs, a read-only one: both need root to mount, and skip without it).
#include "ferry/checkpoint_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "backends/paths.h"
#include "checkpoint/safetensors_writer.h"
#include "core/paths.h"
#include "ferry/checkpoint.h"
#include "ferry/runtime.h"
#include "io/io_seam.h"
#include "pass_through_io.h"
#include "test_hooks.h"
#include "test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Tensors whose bytes live in `store` (kept alive by the caller).
struct Dict {
  std::vector<std::string> store;
  std::vector<TensorSource> tensors;
  void add(std::string name, Dtype dtype, std::vector<std::uint64_t> shape, std::string bytes) {
    store.reserve(64);
    store.push_back(std::move(bytes));
    tensors.push_back({std::move(name), dtype, std::move(shape),
                       store.back().empty() ? nullptr : store.back().data(), store.back().size()});
  }
};

Dict small_dict() {
  Dict d;
  d.add("b", Dtype::kF32, {2}, std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8));
  d.add("c", Dtype::kBool, {3}, std::string("\x01\x00\x01", 3));
  d.add("z", Dtype::kBF16, {0, 2}, "");
  d.add("a", Dtype::kI64, {}, std::string("\x07\x00\x00\x00\x00\x00\x00\x00", 8));
  return d;
}

TEST(SafetensorsLayout, MatchesTheBytesSafetensorsWritesForASmallDict) {
  Dict d = small_dict();
  std::map<std::string, std::string> meta{{"format", "pt"}};
  SafetensorsLayout layout = safetensors_layout(d.tensors, meta);
  // By dtype rank, highest first (I64 > F32 > BF16 > BOOL), then name; the header is 252 bytes
  // of JSON and 4 spaces.
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("z":{"dtype":"BF16","shape":[0,2],"data_offsets":[16,16]},)"
      R"("c":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}}    )";
  ASSERT_EQ(json.size(), 256u);
  const std::string expected = std::string("\x00\x01\x00\x00\x00\x00\x00\x00", 8) + json;
  EXPECT_EQ(layout.header, expected);
  EXPECT_EQ((std::vector<std::size_t>{3, 0, 2, 1}), layout.order);
  EXPECT_EQ(layout.offset[3], 264u);
  EXPECT_EQ(layout.offset[0], 272u);
  EXPECT_EQ(layout.offset[1], 280u);
  EXPECT_EQ(layout.file_size, 283u);
}

TEST(SafetensorsLayout, NoMetadataMeansNoMetadataKeyAndEmptyMeansAnEmptyObject) {
  Dict d;
  d.add("x", Dtype::kU8, {1}, "\x05");
  EXPECT_EQ(safetensors_layout(d.tensors, std::nullopt).header.substr(8),
            R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}   )");
  EXPECT_EQ(safetensors_layout(d.tensors, std::map<std::string, std::string>{}).header.substr(8),
            R"({"__metadata__":{},"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}} )");
}

TEST(SafetensorsLayout, EscapesNamesAsSerdeJsonDoes) {
  Dict d;
  d.add("q\"b\\n\n\x01\x7f/\xc3\xa9", Dtype::kU8, {1}, "\x05");
  const std::string h = safetensors_layout(d.tensors, std::nullopt).header;
  EXPECT_NE(h.find("\"q\\\"b\\\\n\\n\\u0001\x7f/\xc3\xa9\":"), std::string::npos) << h;
}

TEST(SafetensorsLayout, SortsByDtypeRankThenNameBytewise) {
  Dict d;
  for (Dtype t : {Dtype::kBool, Dtype::kF4, Dtype::kU8, Dtype::kI8, Dtype::kF8E5M2, Dtype::kF8E4M3,
                  Dtype::kI16, Dtype::kU16, Dtype::kF16, Dtype::kBF16, Dtype::kI32, Dtype::kU32,
                  Dtype::kF32, Dtype::kC64, Dtype::kF64, Dtype::kI64, Dtype::kU64}) {
    d.add(std::string(to_string(t)), t, {2}, std::string(dtype_bits(t) / 4, '\0'));
  }
  d.add("U8b", Dtype::kU8, {1}, std::string(1, '\0'));
  d.add("U8B", Dtype::kU8, {1}, std::string(1, '\0'));
  SafetensorsLayout layout = safetensors_layout(d.tensors, std::nullopt);
  std::vector<std::string> order;
  for (std::size_t i : layout.order) order.push_back(d.tensors[i].name);
  EXPECT_EQ(order, (std::vector<std::string>{"U64", "I64", "F64", "C64", "F32", "U32", "I32",
                                             "BF16", "F16", "U16", "I16", "F8_E4M3", "F8_E5M2",
                                             "I8", "U8", "U8B", "U8b", "F4", "BOOL"}));
}

TEST(SafetensorsLayout, RefusesBytesThatDoNotMatchTheShapeNamingTheTensor) {
  Dict d;
  d.add("w", Dtype::kF32, {3}, std::string(8, '\0'));
  try {
    safetensors_layout(d.tensors, std::nullopt, "/x/model.safetensors");
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.tensor(), "w");
    EXPECT_NE(std::string(e.what()).find("/x/model.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("12 bytes"), std::string::npos) << e.what();
  }
  Dict two;
  two.add("w", Dtype::kU8, {1}, "a");
  two.add("w", Dtype::kU8, {1}, "b");
  EXPECT_THROW(safetensors_layout(two.tensors, std::nullopt), CheckpointError);
  Dict odd;
  odd.add("p", Dtype::kF4, {3}, "ab");
  EXPECT_THROW(safetensors_layout(odd.tensors, std::nullopt), CheckpointError);
}

TEST(SaveFile, WritesTheLayoutThenTheBytesAndLoadsBack) {
  TempDir dir;
  Dict d = small_dict();
  SaveOptions o;
  o.metadata = std::map<std::string, std::string>{{"format", "pt"}};
  SaveReport r = save_file(d.tensors, dir / "m.safetensors", o);
  EXPECT_EQ(r.files, std::vector<std::string>{(dir / "m.safetensors").string()});
  const std::string bytes = read_all(dir / "m.safetensors");
  SafetensorsLayout layout = safetensors_layout(d.tensors, o.metadata);
  EXPECT_EQ(bytes, layout.header + d.store[3] + d.store[0] + d.store[1]);
  EXPECT_EQ(r.bytes, bytes.size());
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"m.safetensors"});

  Checkpoint ckpt(dir / "m.safetensors");
  EXPECT_EQ(ckpt.metadata().at("format"), "pt");
  LoadOptions lo;
  lo.memory = MemoryKind::kHostPageable;
  LoadResult loaded = ckpt.load(lo);
  for (const LoadedTensor& t : loaded.tensors) {
    auto it = std::find_if(d.tensors.begin(), d.tensors.end(),
                           [&](const TensorSource& s) { return s.name == t.name; });
    ASSERT_NE(it, d.tensors.end());
    EXPECT_EQ(t.shape, it->shape);
    ASSERT_EQ(t.nbytes, it->nbytes);
    if (t.nbytes) {
      EXPECT_EQ(std::memcmp(t.data, it->data, t.nbytes), 0) << t.name;
    }
  }
}

// The system calls of a runtime's Files: the flags of every open, by path.
class OpenFlagsIo final : public test::PassThroughIo {
 public:
  int open(const char* p, int flags, mode_t mode) override {
    {
      std::lock_guard lock(mu);
      opens.emplace_back(p, flags);
    }
    return io::system_io().open(p, flags, mode);
  }
  int sync_file_range(int fd, off_t offset, off_t len, unsigned int flags) override {
    {
      std::lock_guard lock(mu);
      started += static_cast<std::uint64_t>(len);
      ++calls;
      all_async = all_async && flags == SYNC_FILE_RANGE_WRITE;
    }
    return io::IoSeam::sync_file_range(fd, offset, len, flags);
  }
  std::mutex mu;
  std::vector<std::pair<std::string, int>> opens;
  std::uint64_t started = 0;  // bytes whose writeback sync_file_range started
  int calls = 0;
  bool all_async = true;
};

// The temporary file is made empty, then opened without O_TRUNC: after a truncation ext4 writes
// the whole file back at close(2) whenever a block of it still awaits delayed allocation (the
// header's), and a save of 64 tensors (a header over 4 KiB) ran at the disk's speed without an
// fsync (1.4 against 4.1 GB/s on an H200, bench/NOTES.md §26).
TEST(SaveFile, OpensItsTemporaryFileWithoutTruncatingIt) {
  TempDir dir;
  OpenFlagsIo io;
  core::Environment env = backends::default_environment();
  env.io = &io;
  std::unique_ptr<Runtime> runtime = test::RuntimeTestHelper::make(env);
  Dict d = small_dict();
  SaveOptions o;
  o.durable = false;
  o.file.runtime = runtime.get();
  save_file(d.tensors, dir / "m.safetensors", o);
  save_checkpoint(d.tensors, dir / "ckpt", o);
  std::lock_guard lock(io.mu);
  ASSERT_GE(io.opens.size(), 3u) << "the shard, the checkpoint's shard and its index";
  for (const auto& [path, flags] : io.opens) {
    EXPECT_EQ(flags & O_TRUNC, 0) << path;
    EXPECT_NE(flags & (O_WRONLY | O_RDWR), 0) << path;
  }
  EXPECT_EQ(read_all(dir / "m.safetensors"), safetensors_layout(d.tensors, std::nullopt).header +
                                                 d.store[3] + d.store[0] + d.store[1]);
}

// A durable save starts each write's writeback as it goes (write-behind), so that its fsync waits
// for the last bytes only; a save that is not durable leaves its pages to the page cache.
TEST(SaveFile, ADurableSaveStartsTheWritebackOfEveryByteAsItWritesThem) {
  TempDir dir;
  Dict d = small_dict();
  for (bool durable : {true, false}) {
    OpenFlagsIo io;
    core::Environment env = backends::default_environment();
    env.io = &io;
    std::unique_ptr<Runtime> runtime = test::RuntimeTestHelper::make(env);
    SaveOptions o;
    o.durable = durable;
    o.file.runtime = runtime.get();
    SaveReport r = save_file(d.tensors, dir / "m.safetensors", o);
    std::lock_guard lock(io.mu);
    if (durable) {
      EXPECT_EQ(io.started, r.bytes) << "the header and every tensor's bytes";
      EXPECT_TRUE(io.all_async) << "SYNC_FILE_RANGE_WRITE alone: it does not wait";
    } else {
      EXPECT_EQ(io.calls, 0);
    }
    bool said = false;
    for (const RouteReport& route : r.routes) {
      said = said || route.to_text().find("write-behind") != std::string::npos;
    }
    EXPECT_EQ(said, durable) << r.routes.front().to_text();
  }
}

TEST(SaveFile, ReplacesAnOldFileKeepingItsPermissions) {
  TempDir dir;
  test::write_file(dir / "m.safetensors", "old");
  ::chmod((dir / "m.safetensors").c_str(), 0640);
  Dict d = small_dict();
  SaveOptions o;
  o.durable = false;
  save_file(d.tensors, dir / "m.safetensors", o);
  struct stat st {};
  ASSERT_EQ(::stat((dir / "m.safetensors").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(Checkpoint(dir / "m.safetensors").tensors().size(), 4u);
}

TEST(SaveFile, AFolderAtTheNameIsRefusedAndLeftAlone) {
  TempDir dir;
  fs::create_directory(dir / "m.safetensors");
  Dict d = small_dict();
  EXPECT_THROW(save_file(d.tensors, dir / "m.safetensors"), IoError);
  EXPECT_TRUE(fs::is_directory(dir / "m.safetensors"));
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"m.safetensors"});
}

TEST(SaveFile, RemovesTemporaryFilesOfDeadProcesses) {
  TempDir dir;
  // pid 2^22+1 is above the kernel's pid_max limit, so no process has it.
  test::write_file(dir / ".m.safetensors.ferry-4194305-abcdef", "partial");
  test::write_file(dir / ".other.ferry-x", "not ours");
  Dict d = small_dict();
  save_file(d.tensors, dir / "m.safetensors");
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{".other.ferry-x", "m.safetensors"}));
}

// A tmpfs mounted for one test; skips without the right to mount.
class Mount {
 public:
  Mount(const fs::path& at, const char* options) : at_(at) {
    mounted_ = ::mount("tmpfs", at.c_str(), "tmpfs", 0, options) == 0;
  }
  ~Mount() {
    if (mounted_) ::umount2(at_.c_str(), MNT_DETACH);
  }
  bool ok() const { return mounted_; }
  void read_only() { ::mount("tmpfs", at_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr); }

 private:
  fs::path at_;
  bool mounted_ = false;
};

TEST(SaveFile, AFullDiskFailsNamingTheFileAndLeavesTheOldOne) {
  TempDir dir;
  Mount m(dir.path(), "size=256k");
  if (!m.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  test::write_file(dir / "m.safetensors", "old bytes");
  Dict d;
  d.add("big", Dtype::kU8, {1 << 20}, std::string(1 << 20, 'x'));
  try {
    save_file(d.tensors, dir / "m.safetensors");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), ENOSPC);
    EXPECT_EQ(e.path(), (dir / "m.safetensors").string());
    EXPECT_NE(std::string(e.what()).find("No space left"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_all(dir / "m.safetensors"), "old bytes");
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{"m.safetensors"});
}

TEST(SaveFile, AReadOnlyFolderFailsNamingTheFile) {
  TempDir dir;
  Mount m(dir.path(), "size=1m");
  if (!m.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  m.read_only();
  Dict d = small_dict();
  try {
    save_file(d.tensors, dir / "m.safetensors");
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EROFS);
    EXPECT_NE(std::string(e.what()).find((dir / "m.safetensors").string()), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(names_in(dir.path()).empty());
}

Dict numbered(int count, char fill) {
  Dict d;
  for (int i = 0; i < count; ++i) {
    d.add("layer." + std::to_string(i) + ".w", Dtype::kF32, {4}, std::string(16, char(fill + i)));
  }
  return d;
}

void expect_checkpoint(const fs::path& dir, const Dict& d) {
  Checkpoint ckpt(dir);
  ASSERT_EQ(ckpt.tensors().size(), d.tensors.size());
  LoadOptions lo;
  lo.memory = MemoryKind::kHostPageable;
  LoadResult loaded = ckpt.load(lo);
  for (const LoadedTensor& t : loaded.tensors) {
    auto it = std::find_if(d.tensors.begin(), d.tensors.end(),
                           [&](const TensorSource& s) { return s.name == t.name; });
    ASSERT_NE(it, d.tensors.end()) << t.name;
    ASSERT_EQ(t.nbytes, it->nbytes);
    EXPECT_EQ(std::memcmp(t.data, it->data, t.nbytes), 0) << t.name;
  }
}

TEST(SaveCheckpoint, WritesShardsAndAnIndexThatLoadsBack) {
  TempDir dir;
  Dict d = numbered(5, 'a');
  SaveOptions o;
  o.max_shard_size = 32;
  o.metadata = std::map<std::string, std::string>{{"format", "pt"}};
  SaveReport r = save_checkpoint(d.tensors, dir / "ckpt", o);
  EXPECT_EQ(names_in(dir / "ckpt"),
            (std::vector<std::string>{
                "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  EXPECT_EQ(r.files.back(), (dir / "ckpt" / "model.safetensors.index.json").string());
  const auto index = nlohmann::json::parse(read_all(dir / "ckpt" / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 80);
  EXPECT_EQ(index["weight_map"]["layer.4.w"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["layer.0.w"], "model-00001-of-00003.safetensors");
  expect_checkpoint(dir / "ckpt", d);
  EXPECT_EQ(Checkpoint(dir / "ckpt").metadata(2).at("format"), "pt");
}

TEST(SaveCheckpoint, AResaveWithTheSameShardNamesReplacesEveryFileAndLeavesNoTemporary) {
  TempDir dir;
  Dict old_one = numbered(4, 'a');
  SaveOptions o;
  o.max_shard_size = 32;
  save_checkpoint(old_one.tensors, dir.path(), o);
  Dict new_one = numbered(4, 'k');
  save_checkpoint(new_one.tensors, dir.path(), o);
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"model-00001-of-00002.safetensors",
                                                            "model-00002-of-00002.safetensors",
                                                            "model.safetensors.index.json"}));
  expect_checkpoint(dir.path(), new_one);
}

TEST(SaveCheckpoint, AResaveWithFewerShardsRemovesTheOldOnesButNotOtherFiles) {
  TempDir dir;
  test::write_file(dir / "config.json", "{}");
  Dict old_one = numbered(4, 'a');
  SaveOptions o;
  o.max_shard_size = 16;
  save_checkpoint(old_one.tensors, dir.path(), o);
  Dict new_one = numbered(2, 'k');
  o.max_shard_size = 0;
  save_checkpoint(new_one.tensors, dir.path(), o);
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"config.json", "model.safetensors",
                                                            "model.safetensors.index.json"}));
  expect_checkpoint(dir.path(), new_one);
}

TEST(SaveCheckpoint, AnIndexNamingTemporaryShardsOfAKilledSaveIsKeptUntilReplaced) {
  TempDir dir;
  // What a save killed between its two indexes leaves: an index naming shards under their
  // temporary names (of a process that is gone).
  Dict old_one = numbered(2, 'a');
  save_file(old_one.tensors, dir / ".model.safetensors.ferry-4194305-abcdef");
  test::write_file(
      dir / "model.safetensors.index.json",
      R"({"metadata":{},"weight_map":{"layer.0.w":".model.safetensors.ferry-4194305-abcdef",)"
      R"("layer.1.w":".model.safetensors.ferry-4194305-abcdef"}})");
  expect_checkpoint(dir.path(), old_one);
  Dict new_one = numbered(2, 'k');
  SaveOptions o;
  o.max_shard_size = 16;
  save_checkpoint(new_one.tensors, dir.path(), o);
  expect_checkpoint(dir.path(), new_one);
  EXPECT_EQ(names_in(dir.path()).size(), 3u);
}

// Finding 9 of issue 45: a 255-byte name is a valid file name; its temporary name passed NAME_MAX.
TEST(SaveFile, ANameOfTheLongestLengthSaves) {
  TempDir dir;
  std::string name(255 - std::string(".safetensors").size() - 2, 'n');
  name = "\xc3\xa9" + name + ".safetensors";  // a two-byte character first: the cut is byte-wise
  ASSERT_EQ(name.size(), 255u);
  Dict d = small_dict();
  save_file(d.tensors, dir / name);
  EXPECT_EQ(names_in(dir.path()), std::vector<std::string>{name});
}

// Findings 12 and 13 of issue 45: no tensors, or no path, wrote something unloadable or a hidden
// file in the working folder before failing.
TEST(SaveCheckpoint, NoTensorsOrNoPathIsRefusedBeforeAnythingIsWritten) {
  TempDir dir;
  test::expect_io_error([&] { save_checkpoint({}, dir / "ckpt"); }, (dir / "ckpt").string(),
                        EINVAL);
  EXPECT_FALSE(fs::exists(dir / "ckpt"));
  Dict d = small_dict();
  test::expect_io_error([&] { save_checkpoint(d.tensors, ""); }, "\"\"", EINVAL);
  test::expect_io_error([&] { save_file(d.tensors, ""); }, "\"\"", EINVAL);
  test::expect_io_error([&] { save_file(d.tensors, dir / "sub/"); }, (dir / "sub/").string(),
                        EINVAL);
  EXPECT_TRUE(names_in(dir.path()).empty());
}

// Finding 14 of issue 45: a sharded save over a lone model.safetensors that cannot be removed
// reported success, and transformers (model.safetensors first) then loaded the old weights.
TEST(SaveCheckpoint, AnOldSingleFileThatCannotBeRemovedFailsTheSaveSayingWhy) {
  TempDir dir;
  Dict old_one = numbered(4, 'a');
  save_file(old_one.tensors, dir / "model.safetensors");
  // A folder in its place cannot be unlinked: what an undeletable file looks like to unlink(2).
  fs::remove(dir / "model.safetensors");
  fs::create_directory(dir / "model.safetensors");
  test::write_file(dir / "model.safetensors" / "x", "x");
  Dict new_one = numbered(4, 'k');
  SaveOptions o;
  o.max_shard_size = 32;
  try {
    save_checkpoint(new_one.tensors, dir.path(), o);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("transformers"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("committed"), std::string::npos) << e.what();
  }
  expect_checkpoint(dir.path(), new_one);
}

// A save_file into a checkpoint's folder takes its turn with a save_checkpoint there, whose end
// removes model*.safetensors files its index does not name: the rename waits for the folder lock.
TEST(SaveFile, TheRenameWaitsForACheckpointSaveInTheSameFolder) {
  TempDir dir;
  const int held = ::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);  // what a save_checkpoint in progress holds
  Dict d = small_dict();
  std::atomic<bool> done{false};
  std::thread saver([&] {
    save_file(d.tensors, dir / "model.safetensors");
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load());
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  ::close(held);
  saver.join();
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
}

// A folder without an index loads as all its .safetensors files, so a save there goes through its
// temporary names; its end removes only transformers' shard names: another tool's file beside
// them (an adapter's) is not the old checkpoint's to remove.
TEST(SaveCheckpoint, AnotherToolsSafetensorsFileInAFolderWithoutIndexStays) {
  TempDir dir;
  Dict old_one = numbered(2, 'a');
  save_file(old_one.tensors, dir / "model.safetensors");
  Dict adapter;
  adapter.add("lora.a", Dtype::kF32, {1}, std::string(4, 'L'));
  save_file(adapter.tensors, dir / "adapter_model.safetensors");
  Dict new_one = numbered(2, 'k');
  SaveOptions o;
  o.max_shard_size = 16;
  save_checkpoint(new_one.tensors, dir.path(), o);
  EXPECT_EQ(names_in(dir.path()),
            (std::vector<std::string>{
                "adapter_model.safetensors", "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors", "model.safetensors.index.json"}));
  expect_checkpoint(dir.path(), new_one);
}

TEST(SaveProgress, EveryShardByteIsReportedDoneNeverGoingDownAndOnceAtTheTotal) {
  TempDir dir;
  Dict d = numbered(5, 'a');
  SaveOptions o;
  o.max_shard_size = 32;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> seen;
  o.progress.callback = [&](std::uint64_t done, std::uint64_t total) {
    seen.emplace_back(done, total);
  };
  o.progress.interval_seconds = 0;
  save_checkpoint(d.tensors, dir.path(), o);
  std::uint64_t shards = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    if (e.path().extension() == ".safetensors") shards += fs::file_size(e.path());
  }
  ASSERT_FALSE(seen.empty());
  for (std::size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].second, shards) << i;
    if (i > 0) {
      EXPECT_GE(seen[i].first, seen[i - 1].first) << i;
    }
  }
  EXPECT_EQ(seen.back().first, shards);
  expect_checkpoint(dir.path(), d);
}

TEST(SaveProgress, ACallbackThatThrowsAtTheEndLeavesTheOldCheckpointAndNoTemporary) {
  TempDir dir;
  Dict old_one = numbered(4, 'a');
  SaveOptions o;
  o.max_shard_size = 32;
  save_checkpoint(old_one.tensors, dir.path(), o);
  const std::vector<std::string> before = names_in(dir.path());
  Dict new_one = numbered(6, 'k');
  o.progress.callback = [](std::uint64_t done, std::uint64_t total) {
    if (done == total) throw std::runtime_error("interrupted by the progress callback");
  };
  EXPECT_THROW(save_checkpoint(new_one.tensors, dir.path(), o), std::runtime_error);
  EXPECT_EQ(names_in(dir.path()), before);
  expect_checkpoint(dir.path(), old_one);

  // save_file likewise leaves the old file.
  save_file(old_one.tensors, dir / "one.safetensors");
  const std::string old_bytes = read_all(dir / "one.safetensors");
  EXPECT_THROW(save_file(new_one.tensors, dir / "one.safetensors", o), std::runtime_error);
  EXPECT_EQ(read_all(dir / "one.safetensors"), old_bytes);
  EXPECT_EQ(names_in(dir.path()).size(), before.size() + 1);
}

}  // namespace
}  // namespace ferry
