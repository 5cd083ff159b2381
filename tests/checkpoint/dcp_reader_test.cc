// The DCP reader (issue 51 item 2): the restricted unpickler, the torch.save blob reader and the
// loader's DCP branch, over the golden folders stock torch 2.11 wrote (tests/data/dcp).
#include "ferry/dcp_reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/dcp_folder.h"
#include "checkpoint/pickle_reader.h"
#include "checkpoint/torch_save_blob.h"
#include "ferry/checkpoint.h"
#include "test_data.h"

namespace ferry::checkpoint {
namespace {

namespace fs = std::filesystem;

fs::path golden(const char* name) { return test::test_data("dcp") / name; }

// Every tensor of `c` loaded into host memory: what the reads below are compared with.
LoadResult load_on_host(const Checkpoint& c) {
  LoadOptions o;
  o.memory = MemoryKind::kHostPageable;
  return c.load(o);
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "no error";
}

bool nothing_allowed(std::string_view) { return false; }

// A literal's bytes, NULs included.
template <std::size_t N>
std::string bytes_of(const char (&s)[N]) {
  return std::string(s, N - 1);
}

TEST(PickleReader, GoldenMetadataParsesEveryTensorAndByteItem) {
  const DcpMetadata md = parse_dcp_metadata(slurp(golden("single") / ".metadata"), ".metadata");
  ASSERT_EQ(md.tensors.size(), 13u);
  EXPECT_EQ(md.byte_items.size(), 6u);
  const DcpTensorMeta& embed = md.tensors[0];
  EXPECT_EQ(embed.name, "model.embed.weight");
  EXPECT_EQ(embed.dtype, Dtype::kBF16);
  EXPECT_EQ(embed.shape, (std::vector<std::uint64_t>{16, 4}));
  ASSERT_EQ(embed.chunks.size(), 1u);
  EXPECT_EQ(embed.chunks[0].relative_path, "__0_0.distcp");
}

TEST(PickleReader, RefusesOsSystemNamingTheClass) {
  const std::string evil = bytes_of(
      "\x80\x02"
      "cos\nsystem\nX\x02\x00\x00\x00ls\x85R.");
  const std::string why = error_of([&] { parse_dcp_metadata(evil, "/x/.metadata"); });
  EXPECT_NE(why.find("/x/.metadata"), std::string::npos) << why;
  EXPECT_NE(why.find("refuses class os.system"), std::string::npos) << why;
}

TEST(PickleReader, RefusesBuiltinsEvalThroughStackGlobal) {
  const std::string evil = std::string(
                               "\x80\x04\x8c\x08"
                               "builtins\x8c\x04"
                               "eval\x93",
                               19) +
                           "\x8c\x01x\x85R.";
  const std::string why = error_of([&] { parse_dcp_metadata(evil, "/x/.metadata"); });
  EXPECT_NE(why.find("refuses class builtins.eval"), std::string::npos) << why;
}

TEST(PickleReader, TruncatedMetadataNamesTheOffset) {
  const std::string cut = slurp(golden("single") / ".metadata").substr(0, 100);
  const std::string why = error_of([&] { parse_dcp_metadata(cut, "/x/.metadata"); });
  EXPECT_NE(why.find("/x/.metadata: pickle offset"), std::string::npos) << why;
  EXPECT_NE(why.find("truncated"), std::string::npos) << why;
}

TEST(PickleReader, UnknownOpcodeNamesItsOffset) {
  const std::string why = error_of([] { read_pickle("\x80\x02N\xff.", nothing_allowed, "p", 10); });
  EXPECT_NE(why.find("pickle offset 13: unknown or unsupported opcode 0xff"), std::string::npos)
      << why;
}

TEST(PickleReader, ACycleIsRefused) {
  // EMPTY_LIST MEMOIZE BINGET 0 APPEND STOP: a list inside itself.
  const std::string why = error_of([] {
    read_pickle(bytes_of("]\x94h\x00"
                         "a."),
                nothing_allowed, "p");
  });
  EXPECT_NE(why.find("cycle"), std::string::npos) << why;
}

TEST(PickleReader, HandBuiltDataPklNamesStorageOffsetSizeAndStride) {
  // What torch.save writes for a (2, 3) float32 view starting at element 1 of storage '0'.
  const std::string pkl = bytes_of(
      "\x80\x02"
      "ctorch._utils\n_rebuild_tensor_v2\nq\x00((X\x07\x00\x00\x00storageq\x01"
      "ctorch\nFloatStorage\nq\x02X\x01\x00\x00\x00"
      "0q\x03X\x03\x00\x00\x00"
      "cpuq\x04K\x07tq\x05QK\x01K\x02K\x03\x86q\x06K\x03K\x01\x86q\x07\x89"
      "ccollections\nOrderedDict\nq\x08)Rq\x09tq\x0aRq\x0b.");
  const PickleRef v = read_pickle(pkl, torch_save_class_allowed, "data.pkl");
  ASSERT_TRUE(v->is_class("torch._utils._rebuild_tensor_v2"));
  const auto& args = v->args->items;
  ASSERT_EQ(args.size(), 6u);
  EXPECT_EQ(args[0]->items[0]->items[1]->text, "torch.FloatStorage");
  EXPECT_EQ(args[1]->integer, 1);
  EXPECT_EQ(args[2]->items[1]->integer, 3);
  EXPECT_EQ(args[3]->items[0]->integer, 3);
}

TEST(DcpFolder, ADimOneChunkIsOnePiecePerRow) {
  DcpTensorMeta t{"w", Dtype::kF16, {8, 6}, {}};
  DcpChunk c{{0, 3}, {8, 3}, "__1_0.distcp", 0, 0};
  TorchTensorRecord r{"torch.HalfStorage", 1000, 48, 0, {8, 3}, {3, 1}};
  const std::vector<TensorPiece> p = place_chunk(t, c, r, 1, "f");
  ASSERT_EQ(p.size(), 8u);
  EXPECT_EQ(p[1].file_offset, 1000u + 6);
  EXPECT_EQ(p[1].dest, (6u + 3) * 2);
  EXPECT_EQ(p[1].length, 6u);
}

TEST(DcpFolder, ATransposedViewReadsElementByElement) {
  DcpTensorMeta t{"w_t", Dtype::kF32, {6, 8}, {}};
  DcpChunk c{{0, 0}, {6, 8}, "__0_0.distcp", 0, 0};
  TorchTensorRecord r{"torch.FloatStorage", 0, 48 * 4, 0, {6, 8}, {1, 6}};
  const std::vector<TensorPiece> p = place_chunk(t, c, r, 0, "f");
  ASSERT_EQ(p.size(), 48u);
  EXPECT_EQ(p[1].file_offset, 6u * 4);  // element [0, 1] is storage element 6
  EXPECT_EQ(p[1].dest, 4u);
}

TEST(DcpFolder, AChunkReadingPastItsStorageIsRefused) {
  DcpTensorMeta t{"w", Dtype::kF32, {4}, {}};
  DcpChunk c{{0}, {4}, "__0_0.distcp", 0, 0};
  TorchTensorRecord r{"torch.FloatStorage", 0, 12, 0, {4}, {1}};
  EXPECT_NE(error_of([&] { place_chunk(t, c, r, 0, "f"); }).find("reads past its storage"),
            std::string::npos);
}

TEST(DcpFolder, ABlobOfAnotherDtypeThanTheMetadataSaysIsRefused) {
  DcpTensorMeta t{"w", Dtype::kF16, {4}, {}};
  DcpChunk c{{0}, {4}, "__0_0.distcp", 0, 0};
  TorchTensorRecord r{"torch.FloatStorage", 0, 16, 0, {4}, {1}};
  const std::string why = error_of([&] { place_chunk(t, c, r, 0, "f"); });
  EXPECT_NE(why.find("holds a torch.FloatStorage, not the F16"), std::string::npos) << why;
  r.storage_class = "torch.HalfStorage";
  EXPECT_EQ(place_chunk(t, c, r, 0, "f").size(), 1u);
  r.storage_class = "torch.storage.UntypedStorage";  // names no dtype: read as .metadata says
  EXPECT_EQ(place_chunk(t, c, r, 0, "f").size(), 1u);
}

TEST(DcpFolder, GoldenBlobLocatesTheStorageBytes) {
  const std::string bytes = slurp(golden("single") / "__0_0.distcp");
  // model.layers.0.count, arange(5) as int64: its blob is the first chunk whose storage holds 40 B.
  const DcpMetadata md = parse_dcp_metadata(slurp(golden("single") / ".metadata"), ".metadata");
  for (const DcpTensorMeta& t : md.tensors) {
    if (t.name != "model.layers.0.count") continue;
    const DcpChunk& c = t.chunks[0];
    const TorchTensorRecord r = read_torch_save_tensor(
        [&](std::uint64_t at, std::uint64_t n) { return bytes.substr(at, n); }, c.offset, c.length,
        "f");
    EXPECT_EQ(r.storage_class, "torch.LongStorage");
    ASSERT_EQ(r.data_length, 40u);
    std::int64_t v[5];
    std::memcpy(v, bytes.data() + r.data_offset, 40);
    EXPECT_EQ(v[4], 4);
    return;
  }
  FAIL() << "no model.layers.0.count";
}

fs::path copy_of(const char* name) {
  const fs::path dir =
      fs::temp_directory_path() / ("ferry_dcp_" + std::to_string(::getpid()) + name);
  fs::remove_all(dir);
  fs::copy(golden(name), dir);
  return dir;
}

TEST(DcpFolder, AMissingRankFileIsNamed) {
  const fs::path dir = copy_of("two_ranks");
  fs::remove(dir / "__1_0.distcp");
  const std::string why = error_of([&] { Checkpoint c(dir); });
  fs::remove_all(dir);
  EXPECT_NE(why.find("__1_0.distcp: tensor"), std::string::npos) << why;
  EXPECT_NE(why.find("missing"), std::string::npos) << why;
}

TEST(DcpFolder, ATruncatedDistcpNamesTheFileAndOffset) {
  const fs::path dir = copy_of("single");
  fs::resize_file(dir / "__0_0.distcp", 9000);
  const std::string why = error_of([&] { Checkpoint c(dir); });
  fs::remove_all(dir);
  EXPECT_NE(why.find("__0_0.distcp: tensor"), std::string::npos) << why;
  EXPECT_NE(why.find("offset"), std::string::npos) << why;
  EXPECT_NE(why.find("truncated"), std::string::npos) << why;
}

TEST(DcpFolder, TwoRanksLoadWholeTensorsIntoHostMemory) {
  Checkpoint c(golden("two_ranks"));
  LoadOptions o;
  o.memory = MemoryKind::kHostPageable;
  o.names = {"model.layers.0.count"};
  LoadResult r = c.load(o);
  ASSERT_EQ(r.tensors.size(), 1u);
  const auto* v = static_cast<const std::int64_t*>(r.tensors[0].data);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(v[i], i);
  EXPECT_NE(r.report.summary().find("non-tensor item(s) skipped: "), std::string::npos);
}

TEST(DcpFolder, MergeRegionsJoinsOverlappingAndNearRangesUpToTheCap) {
  const ByteRanges merged = merge_regions({{100, 200}, {0, 50}, {150, 300}, {310, 400}, {900, 950}},
                                          /*max_gap=*/20, /*max_region=*/1000);
  EXPECT_EQ(merged, (ByteRanges{{0, 50}, {100, 400}, {900, 950}}));
  // The cap starts a new region rather than grow one past it; a range alone may pass it.
  EXPECT_EQ(merge_regions({{0, 60}, {60, 120}, {120, 400}}, 0, 100),
            (ByteRanges{{0, 60}, {60, 120}, {120, 400}}));
  EXPECT_EQ(merge_regions({{0, 40}, {40, 80}, {80, 90}}, 0, 100), (ByteRanges{{0, 90}}));
}

// Opening read each chunk's blob with five small reads (its end records, its central directory,
// two local headers, data.pkl): 66 reads for single and 61 for two_ranks (strace of 458bf66).
// Each file's blob heads and tails are now read as regions, and the golden files' blobs, smaller
// than a head and a tail, join into one region per file: .metadata plus one read a file.
TEST(DcpFolder, OpeningReadsMetadataAndOneRegionPerFileOfSmallBlobs) {
  for (const char* name : {"single", "two_ranks"}) {
    Checkpoint c(golden(name));
    const LoadResult r = load_on_host(c);
    std::uint64_t files = fs::file_size(golden(name) / ".metadata");
    for (const std::string& shard : c.shards()) files += fs::file_size(shard);
    EXPECT_EQ(r.report.open_reads, 1 + c.shards().size()) << name;
    EXPECT_LE(r.report.open_bytes, files) << name;
    // A whole load reads its tensors' bytes and nothing else.
    EXPECT_EQ(r.report.bytes, c.total_bytes()) << name;
    EXPECT_EQ(r.report.bytes_read, c.total_bytes()) << name;
  }
}

// Issue 51 item 3: a rank's slice of a tensor that two ranks saved in chunks (dim 0 and dim 1)
// reads the slice's bytes from the chunks that hold them, no more than 1.05x of them.
TEST(DcpFolder, ASliceAcrossChunksReadsOnlyItsBytes) {
  Checkpoint c(golden("two_ranks"));
  const LoadResult whole = load_on_host(c);
  for (const char* name :
       {"model.layers.0.attn.w", "optim.state.0.exp_avg", "model.embed.weight"}) {
    const std::size_t i = c.find(name);
    const TensorInfo& t = c.tensors()[i];
    ASSERT_EQ(t.shape.size(), 2u) << name;
    const std::uint64_t row = t.nbytes / t.shape[0];
    const std::uint64_t half = row / 2;  // columns [cols/2, cols) of every row: strided ranges
    std::vector<char> out(t.shape[0] * half);
    std::vector<TensorTarget> targets;
    for (std::uint64_t r = 0; r < t.shape[0]; ++r) {
      targets.push_back({i, out.data() + r * half, r * row + half, half});
    }
    const LoadReport rep = c.read_into(targets);
    EXPECT_EQ(rep.bytes, out.size()) << name;
    EXPECT_GE(rep.bytes_read, out.size()) << name;
    EXPECT_LE(rep.bytes_read, out.size() * 105 / 100) << name;
    const char* full = static_cast<const char*>(whole.tensors[i].data);
    for (std::uint64_t r = 0; r < t.shape[0]; ++r) {
      EXPECT_EQ(std::memcmp(out.data() + r * half, full + r * row + half, half), 0) << name << r;
    }
  }
}

// ferry.dcp.FileSystemReader.read_data's core (issue 51 item 5): the regions of saved chunks that
// a DCP load plan asks for, read into contiguous buffers. Every chunk of every tensor of both
// golden folders, whole, then its second half along its last dimension (strided ranges), each
// equal to the same bytes of the whole tensor as Checkpoint loads it.
TEST(DcpReadItems, EveryChunkAndAStridedPartOfItEqualsTheWholeTensorsBytes) {
  for (const char* folder : {"single", "two_ranks"}) {
    Checkpoint c(golden(folder));
    const LoadResult whole = load_on_host(c);
    const DcpMetadata md = parse_dcp_metadata(slurp(golden(folder) / ".metadata"), ".metadata");
    std::vector<DcpReadItem> items;
    std::vector<std::vector<char>> buffers;
    std::vector<std::pair<std::size_t, std::vector<std::uint64_t>>> expect;  // tensor, first
    std::uint64_t asked = 0;
    for (const DcpTensorMeta& t : md.tensors) {
      for (const DcpChunk& ch : t.chunks) {
        for (bool half : {false, true}) {
          DcpReadItem item{t.name, ch.relative_path, ch.offset, ch.length, t.dtype,
                           {},     ch.sizes,         nullptr};
          item.offsets.assign(ch.sizes.size(), 0);
          if (half) {
            if (ch.sizes.empty() || ch.sizes.back() < 2) continue;
            item.offsets.back() = ch.sizes.back() / 2;
            item.lengths.back() = ch.sizes.back() - ch.sizes.back() / 2;
          }
          std::uint64_t n = dtype_bits(t.dtype) / 8;
          for (std::uint64_t extent : item.lengths) n *= extent;
          buffers.emplace_back(n, '\x55');
          item.buffer = buffers.back().data();
          asked += n;
          std::vector<std::uint64_t> first = ch.offsets;
          for (std::size_t d = 0; d < first.size(); ++d) first[d] += item.offsets[d];
          expect.emplace_back(c.find(t.name), first);
          items.push_back(std::move(item));
        }
      }
    }
    const LoadReport report = read_dcp_items(golden(folder), items);
    EXPECT_EQ(report.bytes, asked) << folder;
    EXPECT_EQ(report.tensors, items.size()) << folder;
    EXPECT_EQ(report.open_reads, c.shards().size()) << folder;  // one region a file
    for (std::size_t i = 0; i < items.size(); ++i) {
      const TensorInfo& t = c.tensors()[expect[i].first];
      const std::uint64_t element = dtype_bits(t.dtype) / 8;
      const char* full = static_cast<const char*>(whole.tensors[expect[i].first].data);
      const std::vector<std::uint64_t>& lengths = items[i].lengths;
      // Compare element by element, walking the region row-major.
      std::uint64_t count = 1;
      for (std::uint64_t extent : lengths) count *= extent;
      std::vector<std::uint64_t> index(lengths.size(), 0);
      for (std::uint64_t e = 0; e < count; ++e) {
        std::uint64_t at = 0;
        for (std::size_t d = 0; d < lengths.size(); ++d) {
          at = at * t.shape[d] + expect[i].second[d] + index[d];
        }
        ASSERT_EQ(std::memcmp(buffers[i].data() + e * element, full + at * element, element), 0)
            << folder << " " << items[i].name << " element " << e;
        for (std::size_t d = lengths.size(); d-- > 0;) {
          if (++index[d] < lengths[d]) break;
          index[d] = 0;
        }
      }
    }
  }
}

TEST(DcpReadItems, ARegionOutsideItsChunkOrAFileOutsideTheFolderIsNamed) {
  const DcpMetadata md = parse_dcp_metadata(slurp(golden("single") / ".metadata"), ".metadata");
  const DcpTensorMeta& t = md.tensors[0];  // model.embed.weight, (16, 4) bf16
  const DcpChunk& ch = t.chunks[0];
  std::vector<char> buffer(16 * 4 * 2);
  DcpReadItem item{t.name,  ch.relative_path, ch.offset, ch.length,
                   t.dtype, {0, 2},           {16, 4},   buffer.data()};
  std::string why = error_of([&] { read_dcp_items(golden("single"), {&item, 1}); });
  EXPECT_NE(why.find("__0_0.distcp: tensor 'model.embed.weight'"), std::string::npos) << why;
  EXPECT_NE(why.find("asks for elements 2..6 of dimension 1"), std::string::npos) << why;
  item.offsets = {0, 0};
  item.dtype = Dtype::kF32;
  why = error_of([&] { read_dcp_items(golden("single"), {&item, 1}); });
  EXPECT_NE(why.find("holds a torch.BFloat16Storage, not the F32"), std::string::npos) << why;
  item.dtype = t.dtype;
  item.relative_path = "../single/__0_0.distcp";
  why = error_of([&] { read_dcp_items(golden("single"), {&item, 1}); });
  EXPECT_NE(why.find("outside the folder"), std::string::npos) << why;
  item.relative_path = ch.relative_path;
  item.blob_length = 1u << 30;
  why = error_of([&] { read_dcp_items(golden("single"), {&item, 1}); });
  EXPECT_NE(why.find("truncated"), std::string::npos) << why;
  // Nothing was read into the buffer by the refused requests.
  EXPECT_EQ(std::count(buffer.begin(), buffer.end(), 0), static_cast<long>(buffer.size()));
}

}  // namespace
}  // namespace ferry::checkpoint
