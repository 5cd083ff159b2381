// Issue 9: page-cache residency in every read's report, and cold tasks of a buffered File read
// with O_DIRECT (faster and far cheaper than buffered reads of cold data on the GPU machine).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "ferry/ferry.h"
#include "io/page_cache.h"
#include "test_runtime.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::TempDir;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// Files opened with test::residency_runtime() see this residency while it lives.
struct ResidencyGuard {
  explicit ResidencyGuard(std::optional<double> f) { test::set_resident_fraction(f); }
  ~ResidencyGuard() { test::set_resident_fraction(std::nullopt); }
};

// In the build tree: /tmp may be tmpfs, which refuses O_DIRECT and is always resident.
struct ColdFile {
  TempDir dir{std::filesystem::current_path().string()};
  std::vector<unsigned char> data;
  std::filesystem::path path = dir / "cold.bin";
  explicit ColdFile(std::size_t size) : data(test::random_bytes(size, 99)) {
    test::write_file(path, data);
  }
};

SettingsOverride tasks_of(std::size_t task_size) {
  SettingsOverride o;
  o.task_size = task_size;
  o.host_nthreads = 3;
  return o;
}

TEST(ColdRead, ReportCarriesTheRangesResidency) {
  ColdFile f(3 * kMiB);
  File file(f.path, "r");
  std::vector<unsigned char> buf(2 * kMiB);
  file.read(buf.data(), buf.size(), kMiB);
  const RouteReport r = file.last_route();
  ASSERT_TRUE(r.page_cache.known) << r.page_cache.why_not;
  EXPECT_EQ(r.page_cache.bytes, 2 * kMiB);
  EXPECT_LE(r.page_cache.resident, r.page_cache.bytes);
  EXPECT_FALSE(r.page_cache.method.empty());
  EXPECT_NE(r.to_text().find("page cache before the request: "), std::string::npos);
  EXPECT_NE(r.to_json().find("\"page_cache\":{"), std::string::npos) << r.to_json();
}

TEST(ColdRead, ColdTasksReadWithODirectAndTheDataIsExact) {
  ResidencyGuard cold(0.0);
  ColdFile f(8 * kMiB + 4096 * 3 + 17);  // a short, unaligned last task
  File file(f.path, "r", {false, tasks_of(2 * kMiB), test::residency_runtime()});
  std::vector<unsigned char> buf(f.data.size() - 100);
  ASSERT_EQ(file.read(buf.data(), buf.size(), 100), buf.size());  // unaligned offset
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), f.data.begin() + 100)) << "data differs";
  const RouteReport r = file.last_route();
  EXPECT_EQ(r.tasks, 5u);
  EXPECT_EQ(r.direct_tasks, 4u) << "the last task is under 1 MiB and stays buffered";
  bool said = false;
  for (const RouteReason& reason : r.reasons) {
    if (reason.code == ReasonCode::kColdDirect) {
      said = true;
      EXPECT_NE(reason.text.find("4 of 5 task(s)"), std::string::npos) << reason.text;
    }
  }
  EXPECT_TRUE(said) << r.to_text();
}

TEST(ColdRead, ResidentTasksStayBuffered) {
  ResidencyGuard warm(0.5);
  ColdFile f(8 * kMiB);
  File file(f.path, "r", {false, tasks_of(2 * kMiB), test::residency_runtime()});
  std::vector<unsigned char> buf(f.data.size());
  ASSERT_EQ(file.read(buf.data(), buf.size()), buf.size());
  EXPECT_EQ(buf, f.data);
  EXPECT_EQ(file.last_route().direct_tasks, 0u);
}

TEST(ColdRead, FileOpenedForDirectIoKeepsItsOwnRoute) {
  ResidencyGuard cold(0.0);
  ColdFile f(4 * kMiB);
  File file(f.path, "r", {true, tasks_of(2 * kMiB), test::residency_runtime()});
  std::vector<unsigned char> buf(f.data.size());
  ASSERT_EQ(file.read(buf.data(), buf.size()), buf.size());
  EXPECT_EQ(buf, f.data);
  EXPECT_EQ(file.last_route().direct_tasks, 0u) << "already O_DIRECT: not counted as cold";
}

// The real measurement: pages dropped with posix_fadvise read as cold, read pages as resident.
TEST(PageCache, MeasuresDroppedAndReadPages) {
  ColdFile f(4 * kMiB);
  int fd = ::open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  PageCacheResidency dropped = io::measure_residency(fd, 0, f.data.size());
  ASSERT_TRUE(dropped.known) << dropped.why_not;
  if (dropped.resident != 0) {
    ::close(fd);
    GTEST_SKIP() << "the kernel kept " << dropped.resident << " B after POSIX_FADV_DONTNEED";
  }
  std::vector<unsigned char> buf(kMiB);
  ASSERT_EQ(::pread(fd, buf.data(), buf.size(), 0), static_cast<ssize_t>(buf.size()));
  PageCacheResidency first = io::measure_residency(fd, 0, kMiB);
  EXPECT_EQ(first.resident, kMiB) << describe(first);
  PageCacheResidency tail = io::measure_residency(fd, 3 * kMiB + 5, kMiB - 5);
  EXPECT_LT(tail.resident, kMiB / 2) << describe(tail);
  ::close(fd);
}

// Issue 32: one residency measurement, public (ferry/page_cache.h), for the engine, `ferry bench`
// and ferry.kvikio's get_page_cache_info.
TEST(PageCacheResidencyCall, MeasuresAFileJustReadAsResidentByPathAndDescriptor) {
  ColdFile f(3 * kMiB + 100);
  std::vector<unsigned char> buf(f.data.size());
  File(f.path, "r").read(buf.data(), buf.size(), 0);
  for (Residency how : {Residency::kSampled, Residency::kExact}) {
    const PageCacheResidency whole = page_cache_residency(f.path.string(), 0, std::nullopt, how);
    ASSERT_TRUE(whole.known) << whole.why_not;
    EXPECT_EQ(whole.bytes, f.data.size()) << "no length: to the end of the file";
    EXPECT_EQ(whole.resident, whole.bytes) << whole.method;
    const PageCacheResidency tail = page_cache_residency(f.path.string(), kMiB, std::nullopt, how);
    EXPECT_EQ(tail.bytes, f.data.size() - kMiB);
  }
  const int fd = ::open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const PageCacheResidency part = page_cache_residency(fd, 4096, 8192, Residency::kExact);
  EXPECT_TRUE(part.known) << part.why_not;
  EXPECT_EQ(part.bytes, 8192u);
  EXPECT_EQ(part.resident, 8192u);
  EXPECT_EQ(page_cache_residency(fd, f.data.size() + 10).bytes, 0u) << "past the end: nothing";
  ::close(fd);
}

TEST(PageCacheResidencyCall, DroppedPagesAreSeenGoneEveryPageLookedAt) {
  ColdFile f(80 * kMiB);  // over kMincoreExact: the exact kind still looks at every page
  std::vector<unsigned char> buf(f.data.size());
  File(f.path, "r").read(buf.data(), buf.size(), 0);
  const int fd = ::open(f.path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ::fdatasync(fd);
  ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  const PageCacheResidency r = page_cache_residency(fd, 0, std::nullopt, Residency::kExact);
  ::close(fd);
  ASSERT_TRUE(r.known) << r.why_not;
  EXPECT_FALSE(r.estimated);
  if (r.resident == r.bytes) GTEST_SKIP() << "this file system kept every page (tmpfs?)";
  EXPECT_LT(r.fraction(), 0.5) << r.method;
}

TEST(PageCacheResidencyCall, AMissingFileIsAnErrorNamingIt) {
  TempDir dir;
  const std::string missing = (dir / "missing.bin").string();
  try {
    page_cache_residency(missing);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
    EXPECT_EQ(e.error_code(), ENOENT);
  }
  EXPECT_FALSE(page_cache_residency(-1, 0, std::nullopt).known) << "a bad descriptor: unknown";
}

}  // namespace
}  // namespace ferry
