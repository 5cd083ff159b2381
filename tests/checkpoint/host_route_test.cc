// Host loads by residency (issue 48): a shard resident in the page cache comes back as views of
// a private mapping, byte for byte what the read route gives, writes never reaching the file and
// the tensors outliving the file; host_load forces either route; the report says which and why.
#include "checkpoint/host_route.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint/safetensors_writer.h"
#include "ferry/page_cache.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::TempDir;
using test::WrittenTensor;

// Data starts 8-aligned (the writer pads the header), so "ids" (I64 at data byte 281) is the
// one tensor whose offset is not a multiple of its dtype's size.
std::vector<WrittenTensor> odd_dtypes(unsigned seed) {
  return {{"embed", "BF16", {16, 8}, test::pattern(256, seed)},
          {"scale", "F32", {}, test::pattern(4, seed + 1)},
          {"empty", "F16", {0, 3}, ""},
          {"q", "F8_E4M3", {7, 3}, test::pattern(21, seed + 2)},
          {"ids", "I64", {5}, test::pattern(40, seed + 3)},
          {"mask", "BOOL", {3}, std::string("\1\0\1", 3)},
          {"packed", "F4", {6}, test::pattern(3, seed + 4)}};
}

LoadOptions host(HostLoad route, std::vector<std::string> names = {}) {
  LoadOptions o;
  o.memory = MemoryKind::kHostPageable;
  o.host_load = route;
  o.names = std::move(names);
  return o;
}

std::string bytes_of(const LoadedTensor& t) {
  return std::string(static_cast<const char*>(t.data), t.nbytes);
}

std::string file_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(HostRoute, AMappedLoadGivesTheReadRoutesBytesAndCopiesTheUnalignedTensor) {
  TempDir dir;
  const auto written = odd_dtypes(11);
  test::write_file(dir / "m.safetensors", test::safetensors_bytes(written));
  Checkpoint ckpt(dir / "m.safetensors");
  LoadResult mapped = ckpt.load(host(HostLoad::kMap));
  LoadResult read = ckpt.load(host(HostLoad::kRead));
  ASSERT_EQ(mapped.tensors.size(), written.size());
  for (std::size_t k = 0; k < written.size(); ++k) {
    EXPECT_EQ(bytes_of(mapped.tensors[k]), written[k].bytes) << written[k].name;
    EXPECT_EQ(bytes_of(mapped.tensors[k]), bytes_of(read.tensors[k])) << written[k].name;
    // Views, except the empty tensor and the unaligned I64, which were read.
    const bool view = written[k].name != "ids" && written[k].name != "empty";
    EXPECT_EQ(mapped.tensors[k].mapped, view) << written[k].name;
    EXPECT_FALSE(read.tensors[k].mapped);
  }
  ASSERT_EQ(mapped.report.host_routes.size(), 1u);
  const HostRoute& r = mapped.report.host_routes[0];
  EXPECT_EQ(r.path, "mapped");
  EXPECT_EQ(r.reason, "host_load=map: tensors are views of a private mapping");
  EXPECT_EQ(r.tensors, 5u);
  EXPECT_EQ(r.bytes, 256u + 4 + 21 + 3 + 3);
  EXPECT_EQ(r.copied, 1u);
  EXPECT_EQ(mapped.mappings.size(), 1u);
  EXPECT_EQ(mapped.report.bytes, ckpt.total_bytes());
  ASSERT_EQ(mapped.report.routes.size(), 1u);  // the I64's read
  EXPECT_EQ(mapped.report.routes[0].bytes, 40u);
  EXPECT_NE(mapped.report.summary().find("m.safetensors: mapped: host_load=map"), std::string::npos)
      << mapped.report.summary();
  EXPECT_NE(mapped.report.to_json().find("\"path\":\"mapped\""), std::string::npos);
  ASSERT_EQ(read.report.host_routes.size(), 1u);
  EXPECT_EQ(read.report.host_routes[0].path, "read");
  EXPECT_EQ(read.report.host_routes[0].reason, "host_load=read");
  EXPECT_TRUE(read.mappings.empty());
}

TEST(HostRoute, WritesToAMappedTensorNeverReachTheFile) {
  TempDir dir;
  const auto written = odd_dtypes(12);
  const std::string file = test::safetensors_bytes(written);
  test::write_file(dir / "m.safetensors", file);
  Checkpoint ckpt(dir / "m.safetensors");
  LoadResult r = ckpt.load(host(HostLoad::kMap));
  ASSERT_TRUE(r.tensors[0].mapped);
  std::memset(r.tensors[0].data, 0x5a, r.tensors[0].nbytes);
  EXPECT_EQ(file_text(dir / "m.safetensors"), file);
  EXPECT_EQ(bytes_of(ckpt.load(host(HostLoad::kMap)).tensors[0]), written[0].bytes);
}

TEST(HostRoute, MappedTensorsOutliveTheCheckpointAndTheFile) {
  TempDir dir;
  const auto written = odd_dtypes(13);
  test::write_file(dir / "m.safetensors", test::safetensors_bytes(written));
  LoadResult r = Checkpoint(dir / "m.safetensors").load(host(HostLoad::kMap));
  std::filesystem::remove(dir / "m.safetensors");
  test::write_file(dir / "m.safetensors", std::string(4096, 'x'));  // another file by that name
  for (std::size_t k = 0; k < written.size(); ++k) {
    EXPECT_EQ(bytes_of(r.tensors[k]), written[k].bytes) << written[k].name;
  }
}

TEST(HostRoute, ASubsetMapsOnlyItsTensorsPages) {
  TempDir dir;
  std::vector<WrittenTensor> written = {{"a", "F32", {4096}, test::pattern(16384, 1)},
                                        {"b", "F32", {4096}, test::pattern(16384, 2)},
                                        {"c", "F32", {4096}, test::pattern(16384, 3)}};
  test::write_file(dir / "m.safetensors", test::safetensors_bytes(written));
  LoadResult r = Checkpoint(dir / "m.safetensors").load(host(HostLoad::kMap, {"b"}));
  ASSERT_EQ(r.tensors.size(), 1u);
  EXPECT_EQ(bytes_of(r.tensors[0]), written[1].bytes);
  ASSERT_EQ(r.mappings.size(), 1u);
  EXPECT_LE(r.mappings[0]->size(), 16384u + 4096);
  EXPECT_EQ(r.mappings[0]->offset() % 4096, 0u);
}

TEST(HostRoute, TheSettingChoosesWhenTheLoadDoesNot) {
  TempDir dir;
  const auto written = odd_dtypes(14);
  test::write_file(dir / "m.safetensors", test::safetensors_bytes(written));
  for (const char* mode : {"map", "read"}) {
    FileOptions options;
    options.settings.set("host_load", mode);
    LoadOptions o;
    o.memory = MemoryKind::kHostPageable;
    LoadResult r = Checkpoint(dir / "m.safetensors", options).load(o);
    ASSERT_EQ(r.report.host_routes.size(), 1u) << mode;
    EXPECT_EQ(r.report.host_routes[0].reason.rfind(std::string("host_load=") + mode, 0), 0u)
        << r.report.host_routes[0].reason;
  }
  SettingsOverride bad;
  try {
    bad.set("host_load", "mmap");
    ADD_FAILURE() << "host_load=mmap was accepted";
  } catch (const SettingError& e) {
    EXPECT_NE(std::string(e.what()).find("auto (map files resident in the page cache"),
              std::string::npos)
        << e.what();
  }
}

// Cold, the shard is mapped too, and its pages are read in before the load returns: parallel
// faults outran ferry's read into fresh memory (bench/NOTES.md §31, round 2).
TEST(HostRoute, AutoMapsAResidentFileAndPopulatesOneDroppedFromThePageCache) {
  TempDir dir;
  const auto written = odd_dtypes(15);
  const auto path = dir / "m.safetensors";
  test::write_file(path, test::safetensors_bytes(written));
  file_text(path);  // every page cached
  Checkpoint ckpt(path);
  LoadResult hot = ckpt.load(host(HostLoad::kAuto));
  ASSERT_EQ(hot.report.host_routes.size(), 1u);
  EXPECT_EQ(hot.report.host_routes[0].path, "mapped") << hot.report.host_routes[0].reason;
  EXPECT_NE(hot.report.host_routes[0].reason.find("resident in the page cache"), std::string::npos);
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  const PageCacheResidency left = page_cache_residency(fd, 0, std::nullopt, Residency::kExact);
  ::close(fd);
  if (!left.known || left.fraction() >= checkpoint::kMapResident) {
    GTEST_SKIP() << "this file system keeps the pages (tmpfs?): " << describe(left);
  }
  LoadResult cold = ckpt.load(host(HostLoad::kAuto));
  ASSERT_EQ(cold.report.host_routes.size(), 1u);
  const HostRoute& r = cold.report.host_routes[0];
  EXPECT_EQ(r.path, "populated");
  EXPECT_EQ(r.reason.rfind("not resident in the page cache (", 0), 0u) << r.reason;
  EXPECT_NE(r.reason.find("): tensors are views of a private mapping, read in by parallel faults "
                          "before the load returns"),
            std::string::npos)
      << r.reason;
  EXPECT_EQ(r.tensors, 5u);
  EXPECT_EQ(r.copied, 1u);
  EXPECT_EQ(cold.report.bytes, ckpt.total_bytes());
  EXPECT_NE(cold.report.summary().find("m.safetensors: populated: not resident"), std::string::npos)
      << cold.report.summary();
  ASSERT_EQ(cold.mappings.size(), 1u);
  const PageCacheResidency after =
      page_cache_residency(path.string(), 0, std::nullopt, Residency::kExact);
  EXPECT_EQ(after.resident, after.bytes) << describe(after);  // read in before the return
  // and mapped into this process: every page in its page tables (what the resident route skips)
  const test::MappingFacts populated = test::mapping_facts(cold.mappings[0]->data());
  ASSERT_TRUE(populated.found);
  EXPECT_EQ(populated.rss_kib, populated.size_kib) << populated.flags;
  for (std::size_t k = 0; k < written.size(); ++k) {
    EXPECT_EQ(bytes_of(cold.tensors[k]), written[k].bytes) << written[k].name;
    EXPECT_EQ(cold.tensors[k].mapped, written[k].name != "ids" && written[k].name != "empty");
  }
}

// Regression (issue 48 item 2): on a resident file the default route does what host_load=map
// does, so that it costs what map costs: one mapping of the same extent with the same advice,
// nothing faulted in before the load returns (safetensors' semantics), the same tensors views of
// it. The H100's "auto 0.55x of map" was the bench's first process reading torch's code from
// disk, not the route (bench/NOTES.md §47); this keeps the route from making it true.
TEST(HostRoute, AutoOnAResidentFileMapsExactlyAsMapDoes) {
  TempDir dir;
  auto written = odd_dtypes(16);
  written.push_back({"big", "U8", {std::size_t{8} << 20}, test::pattern(std::size_t{8} << 20, 17)});
  const auto path = dir / "m.safetensors";
  test::write_file(path, test::safetensors_bytes(written));
  file_text(path);  // every page cached
  Checkpoint ckpt(path);
  LoadResult by_map = ckpt.load(host(HostLoad::kMap));
  LoadResult by_auto = ckpt.load(host(HostLoad::kAuto));
  ASSERT_EQ(by_auto.report.host_routes.size(), 1u);
  ASSERT_EQ(by_map.report.host_routes.size(), 1u);
  const HostRoute& a = by_auto.report.host_routes[0];
  const HostRoute& m = by_map.report.host_routes[0];
  if (!a.page_cache.known || a.page_cache.fraction() < checkpoint::kMapResident) {
    GTEST_SKIP() << "the file did not stay resident: " << describe(a.page_cache);
  }
  EXPECT_EQ(a.path, "mapped") << a.reason;
  EXPECT_EQ(a.reason.rfind("resident in the page cache (", 0), 0u) << a.reason;
  EXPECT_EQ(m.path, "mapped") << m.reason;
  EXPECT_EQ(a.tensors, m.tensors);
  EXPECT_EQ(a.bytes, m.bytes);
  EXPECT_EQ(a.copied, m.copied);
  EXPECT_EQ(by_auto.report.bytes, by_map.report.bytes);
  EXPECT_EQ(by_auto.report.routes.size(), by_map.report.routes.size());  // the copied tensor's
  ASSERT_EQ(by_auto.mappings.size(), 1u);
  ASSERT_EQ(by_map.mappings.size(), 1u);
  EXPECT_EQ(by_auto.mappings[0]->offset(), by_map.mappings[0]->offset());
  EXPECT_EQ(by_auto.mappings[0]->size(), by_map.mappings[0]->size());
  const test::MappingFacts fa = test::mapping_facts(by_auto.mappings[0]->data());
  const test::MappingFacts fm = test::mapping_facts(by_map.mappings[0]->data());
  ASSERT_TRUE(fa.found && fm.found);
  EXPECT_EQ(fa.size_kib, fm.size_kib);
  EXPECT_EQ(fa.flags, fm.flags);
  EXPECT_EQ(fa.rss_kib, 0u) << "auto faulted pages in before returning: " << fa.flags;
  EXPECT_EQ(fm.rss_kib, 0u) << "map faulted pages in before returning: " << fm.flags;
  for (std::size_t k = 0; k < written.size(); ++k) {
    EXPECT_EQ(by_auto.tensors[k].mapped, by_map.tensors[k].mapped) << written[k].name;
    EXPECT_EQ(bytes_of(by_auto.tensors[k]), written[k].bytes) << written[k].name;
  }
}

// Populating reports its progress, reads every page in, and fails naming the file and the
// offset where the file ends short of the mapping (EFAULT: touching there would be SIGBUS).
TEST(HostRoute, PopulateReadsEveryPageAndNamesWhereAFileEndsShort) {
  TempDir dir;
  const auto path = dir / "m.bin";
  constexpr std::size_t kBytes = std::size_t{6} << 20;
  test::write_file(path, std::string(kBytes, 'p'));
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  FileMapping whole(fd, 0, kBytes, "m.bin");
  std::vector<std::uint64_t> seen;
  checkpoint::populate({&whole}, 3, 1 << 20, [&](std::uint64_t done) { seen.push_back(done); });
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  for (std::uint64_t done : seen) EXPECT_LE(done, kBytes);
  const PageCacheResidency after = page_cache_residency(fd, 0, std::nullopt, Residency::kExact);
  EXPECT_EQ(after.resident, kBytes) << describe(after);
  ASSERT_EQ(::ftruncate(fd, 4 << 20), 0);
  ::close(fd);
  try {
    checkpoint::populate({&whole}, 2, 1 << 20, [](std::uint64_t) {});
    ADD_FAILURE() << "a mapping past the end of its file was populated";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EFAULT);
    EXPECT_NE(std::string(e.what()).find("madvise(MADV_POPULATE_READ) m.bin offset="),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("the file is shorter than when the load began"),
              std::string::npos)
        << e.what();
  }
}

// The address space capped (RLIMIT_AS) below the file's size: mmap fails with ENOMEM, and the
// load reads into memory allocated before the cap, saying why.
TEST(HostRoute, AMappingThatFailsFallsBackToTheReadSayingWhy) {
  TempDir dir;
  constexpr std::size_t kBytes = std::size_t{48} << 20;
  const std::vector<WrittenTensor> written = {{"big", "U8", {kBytes}, std::string(kBytes, 'z')}};
  test::write_file(dir / "m.safetensors", test::safetensors_bytes(written));
  Checkpoint ckpt(dir / "m.safetensors");
  std::vector<char> memory(kBytes);
  LoadOptions o = host(HostLoad::kMap);
  o.allocate = [&](std::uint64_t) { return memory.data(); };
  LoadOptions warm = o;  // the workers exist before the cap (their stacks are mappings too)
  warm.host_load = HostLoad::kRead;
  ckpt.load(warm);
  std::memset(memory.data(), 0, kBytes);
  std::ifstream statm("/proc/self/statm");
  std::uint64_t pages = 0;
  ASSERT_TRUE(statm >> pages);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &old), 0);
  rlimit capped = old;
  capped.rlim_cur = pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE)) + (16 << 20);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &capped), 0);
  LoadResult r;
  try {
    r = ckpt.load(o);
  } catch (...) {
    setrlimit(RLIMIT_AS, &old);
    throw;
  }
  setrlimit(RLIMIT_AS, &old);
  ASSERT_EQ(r.report.host_routes.size(), 1u);
  EXPECT_EQ(r.report.host_routes[0].path, "read");
  EXPECT_EQ(r.report.host_routes[0].reason,
            "host_load=map, but the mapping failed (Cannot allocate memory): read instead");
  EXPECT_TRUE(r.mappings.empty());
  EXPECT_EQ(std::string(memory.data(), kBytes), written[0].bytes);
}

TEST(HostRoute, EachRefusalToMapSaysWhy) {
  PageCacheResidency all{true, "", 100, 100, false, "test"};
  PageCacheResidency half{true, "", 50, 100, false, "test"};
  PageCacheResidency unknown;
  unknown.why_not = "no cachestat, no mincore";
  using checkpoint::decide_host_route;
  EXPECT_EQ(decide_host_route(HostLoad::kAuto, false, false, all).path, "mapped");
  EXPECT_EQ(decide_host_route(HostLoad::kAuto, true, false, all).reason,
            "a remote object: ranged GETs");
  EXPECT_EQ(decide_host_route(HostLoad::kMap, true, false, all).reason,
            "host_load=map, but a remote object cannot be mapped: ranged GETs");
  EXPECT_EQ(decide_host_route(HostLoad::kAuto, false, true, all).path, "read");
  EXPECT_EQ(decide_host_route(HostLoad::kMap, false, true, half).path, "mapped");
  EXPECT_EQ(decide_host_route(HostLoad::kAuto, false, false, half).path, "populated");
  EXPECT_EQ(decide_host_route(HostLoad::kMap, false, false, half).path, "mapped");
  EXPECT_EQ(decide_host_route(HostLoad::kRead, false, false, half).path, "read");
  EXPECT_EQ(decide_host_route(HostLoad::kAuto, false, false, unknown).path, "populated");
  EXPECT_EQ(decide_host_route(HostLoad::kAuto, false, false, unknown).reason,
            "residency unknown (no cachestat, no mincore): tensors are views of a private "
            "mapping, read in by parallel faults before the load returns");
}

}  // namespace
}  // namespace ferry
