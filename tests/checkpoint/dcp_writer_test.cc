// ferry's DCP writing core (issue 51 items 1 and 4): the torch.save blob writer read back by
// ferry's blob reader (torch.load's side is tests/python/test_dcp_writer.py), and folders written
// by write_dcp_file and committed by commit_dcp_metadata loaded back bit-exact by ferry's DCP
// loader. The commit under faults is in save_fault_test.cc.
#include "ferry/dcp_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>

#include "checkpoint/dcp_metadata_pickle.h"
#include "checkpoint/torch_save_blob.h"
#include "checkpoint/torch_save_writer.h"
#include "ferry/checkpoint.h"
#include "test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using checkpoint::TorchSaveBlob;

// A ReadAt over a blob at `at` whose tensor bytes are `data`, or zeros where `data` is empty.
checkpoint::ReadAt reader_of(const TorchSaveBlob& b, std::uint64_t at, std::string_view data) {
  return [=, &b](std::uint64_t offset, std::uint64_t length) {
    std::string out;
    for (std::uint64_t i = offset; i < offset + length; ++i) {
      if (i < at + b.head.size()) {
        out.push_back(b.head.at(i - at));
      } else if (i < b.data_offset + (b.length - b.head.size() - b.tail.size())) {
        out.push_back(data.empty() ? '\0' : data.at(i - b.data_offset));
      } else {
        out.push_back(b.tail.at(i - (at + b.length - b.tail.size())));
      }
    }
    return out;
  };
}

TEST(TorchSaveWriter, EachBlobReadsBackThroughFerrysBlobReaderAligned) {
  struct Case {
    Dtype dtype;
    std::vector<std::uint64_t> shape;
    const char* storage;
  };
  for (const Case& c : {Case{Dtype::kF32, {2, 3}, "torch.FloatStorage"},
                        Case{Dtype::kBF16, {5000}, "torch.BFloat16Storage"},
                        Case{Dtype::kF16, {3, 1, 2}, "torch.HalfStorage"},
                        Case{Dtype::kI64, {}, "torch.LongStorage"},
                        Case{Dtype::kU8, {0, 4}, "torch.ByteStorage"}}) {
    for (std::uint64_t at : {0u, 1000u}) {
      const TorchSaveBlob b = checkpoint::torch_save_blob("t", c.dtype, c.shape, at, 4096);
      const checkpoint::TorchTensorRecord r =
          checkpoint::read_torch_save_tensor(reader_of(b, at, ""), at, b.length, "f");
      std::uint64_t numel = 1;
      for (std::uint64_t s : c.shape) numel *= s;
      EXPECT_EQ(r.storage_class, c.storage);
      EXPECT_EQ(r.data_offset, b.data_offset);
      EXPECT_EQ(r.data_offset % 4096, 0u);
      EXPECT_EQ(r.data_length, numel * dtype_bits(c.dtype) / 8);
      EXPECT_EQ(r.size, c.shape);
      EXPECT_EQ(r.storage_offset, 0u);
      std::vector<std::uint64_t> stride(c.shape.size(), 1);
      for (std::size_t d = c.shape.size(); d-- > 1;) stride[d - 1] = stride[d] * c.shape[d];
      EXPECT_EQ(r.stride, stride);
    }
  }
}

TEST(TorchSaveWriter, ATensorOf5GiBGetsZip64Records) {
  const std::vector<std::uint64_t> shape{5ull << 30};
  const std::uint64_t at = 6ull << 30;  // its blob past 4 GiB of the file as well
  const TorchSaveBlob b = checkpoint::torch_save_blob("big", Dtype::kU8, shape, at, 4096);
  const checkpoint::TorchTensorRecord r =
      checkpoint::read_torch_save_tensor(reader_of(b, at, ""), at, b.length, "f");
  EXPECT_EQ(r.data_length, 5ull << 30);
  EXPECT_EQ(r.data_offset, b.data_offset);
  EXPECT_NE(b.tail.find(std::string("PK\6\6", 4)), std::string::npos);
}

TEST(TorchSaveWriter, ADtypeWithoutAStorageClassIsRefusedNamingTheTensor) {
  const std::vector<std::uint64_t> shape{4};
  try {
    checkpoint::torch_save_blob("model.w8", Dtype::kF8E4M3, shape, 0, 64);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.tensor(), "model.w8");
    EXPECT_NE(std::string(e.what()).find("F8_E4M3"), std::string::npos) << e.what();
  }
}

struct Tensor {
  std::string name;
  Dtype dtype;
  const char* torch_dtype;
  std::vector<std::uint64_t> shape;
  std::string bytes;
};

std::vector<Tensor> some_tensors() {
  std::vector<Tensor> out{{"model.w", Dtype::kF32, "float32", {3, 1000}, ""},
                          {"model.b", Dtype::kBF16, "bfloat16", {7}, ""},
                          {"optim.state.0.step", Dtype::kI64, "int64", {}, ""},
                          {"optim.state.0.exp_avg", Dtype::kF16, "float16", {0}, ""}};
  int seed = 1;
  for (Tensor& t : out) {
    std::uint64_t n = dtype_bits(t.dtype) / 8;
    for (std::uint64_t s : t.shape) n *= s;
    for (std::uint64_t i = 0; i < n; ++i) t.bytes.push_back(static_cast<char>(seed++ * 37));
  }
  return out;
}

// Writes `tensors` as two ranks' files (even and odd tensors) plus a byte item, and commits.
std::vector<std::string> save(const fs::path& dir, const std::vector<Tensor>& tensors,
                              const std::string& id) {
  const DcpSaveLock lock(dir, true);
  std::vector<test::DcpEntry> entries;
  std::vector<std::string> files;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = "__" + std::to_string(rank) + "_0." + id + ".distcp";
    std::vector<DcpWriteItem> items;
    for (std::size_t i = rank; i < tensors.size(); i += 2) {
      const Tensor& t = tensors[i];
      items.push_back({{t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()}, false, ""});
    }
    DcpWriteItem extra;
    extra.tensor.name = "extra." + std::to_string(rank);
    extra.is_bytes = true;
    extra.bytes = "pickled " + id;
    items.push_back(extra);
    const std::vector<DcpItemPlace> places = write_dcp_file(items, dir / file);
    for (std::size_t k = 0; k < items.size(); ++k) {
      const Tensor* t = k + 1 < items.size() ? &tensors[rank + 2 * k] : nullptr;
      const std::vector<std::uint64_t> shape = t ? t->shape : std::vector<std::uint64_t>{};
      entries.push_back({items[k].tensor.name, t ? t->torch_dtype : "", shape, file,
                         places[k].offset, places[k].length});
    }
    files.push_back(file);
  }
  commit_dcp_metadata(dir, test::dcp_metadata_pickle(entries), files);
  return files;
}

LoadResult load(const fs::path& dir) {
  Checkpoint ckpt(dir);
  LoadOptions lo;
  lo.memory = MemoryKind::kHostPageable;
  return ckpt.load(lo);
}

TEST(DcpWriter, AFolderOfTwoRanksLoadsBitExactThroughFerrysDcpLoader) {
  test::TempDir dir;
  const std::vector<Tensor> tensors = some_tensors();
  save(dir.path(), tensors, "a");
  const LoadResult loaded = load(dir.path());
  ASSERT_EQ(loaded.tensors.size(), tensors.size());
  for (const Tensor& t : tensors) {
    SCOPED_TRACE(t.name);
    auto it = std::find_if(loaded.tensors.begin(), loaded.tensors.end(),
                           [&](const LoadedTensor& l) { return l.name == t.name; });
    ASSERT_NE(it, loaded.tensors.end());
    EXPECT_EQ(it->dtype, t.dtype);
    EXPECT_EQ(it->shape, t.shape);
    ASSERT_EQ(it->nbytes, t.bytes.size());
    EXPECT_EQ(std::memcmp(it->data, t.bytes.data(), t.bytes.size()), 0);
  }
}

TEST(DcpWriter, TheCommitRemovesTheOldDistcpFilesAndNothingElse) {
  test::TempDir dir;
  std::ofstream(dir / "__0_0.distcp") << "a stock save's file";
  std::ofstream(dir / "config.json") << "{}";
  std::vector<Tensor> tensors = some_tensors();
  const std::vector<std::string> first = save(dir.path(), tensors, "a");
  tensors[0].bytes[0] ^= 1;
  const std::vector<std::string> second = save(dir.path(), tensors, "b");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{".metadata", "__0_0.b.distcp", "__1_0.b.distcp",
                                             "config.json"}));
  const LoadResult loaded = load(dir.path());
  EXPECT_EQ(static_cast<const char*>(loaded.tensors[0].data)[0], tensors[0].bytes[0]);
}

TEST(DcpWriter, AMissingOrTruncatedRankFileIsAnErrorNamingIt) {
  test::TempDir dir;
  const std::vector<std::string> files = save(dir.path(), some_tensors(), "a");
  fs::resize_file(dir / files[1], fs::file_size(dir / files[1]) / 2);
  try {
    load(dir.path());
    FAIL() << "a truncated file loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(files[1]), std::string::npos) << e.what();
  }
  fs::remove(dir / files[1]);
  try {
    load(dir.path());
    FAIL() << "a missing file loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(files[1]), std::string::npos) << e.what();
  }
}

TEST(DcpWriter, BytesNotMatchingShapeAndDtypeAreRefusedAndNoFileIsLeft) {
  test::TempDir dir;
  const std::string bytes(10, 'x');
  const std::vector<DcpWriteItem> items{
      {{"model.view", Dtype::kF32, {2, 3}, bytes.data(), bytes.size()}, false, ""}};
  try {
    write_dcp_file(items, dir / "__0_0.x.distcp");
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(e.tensor(), "model.view");
    EXPECT_NE(std::string(e.what()).find("24 B"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(DcpWriter, ASecondLockOnTheFolderIsRefusedAtOnce) {
  test::TempDir dir;
  const DcpSaveLock first(dir / "ckpt", true);
  try {
    const DcpSaveLock second(dir / "ckpt", true);
    FAIL() << "two locks";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EBUSY);
    EXPECT_NE(std::string(e.what()).find("a second writer is refused"), std::string::npos);
  }
}

}  // namespace
}  // namespace ferry
