// Resource hygiene: 10,000 open/read/close cycles (buffered and O_DIRECT, and through the error
// paths) leave the process with the same descriptors, the same threads and about the same
// memory. LeakSanitizer (the asan preset) checks the heap; this checks what it cannot see.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "backends/default_runtime.h"
#include "core/runtime_state.h"
#include "ferry/ferry.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::TempDir;

std::size_t count_entries(const char* dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

std::size_t open_fds() { return count_entries("/proc/self/fd"); }
std::size_t threads() { return count_entries("/proc/self/task"); }
// The default runtime's worker threads. Its pool grows with the jobs running and queued, up to
// the nthreads settings, so its size may still move after a warm-up (a request submitted while
// the previous one's jobs are returning counts them): bounded, not a leak.
std::size_t pool_threads() {
  core::RuntimeState& rt = backends::default_runtime();
  return rt.pool().size() + rt.ordered_pool().size();
}
constexpr std::size_t kHostThreadsDefault = 16;  // host_nthreads' default

std::size_t rss_kib() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmRSS:") {
      std::size_t kib = 0;
      in >> kib;
      return kib;
    }
  }
  return 0;
}

// Sanitizers keep freed memory in quarantine and shadow it: RSS says nothing about leaks there.
bool sanitized() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#else
  return false;
#endif
}

constexpr int kCycles = 10000;

TEST(Hygiene, TenThousandOpenReadCloseCyclesLeakNothing) {
  TempDir dir;
  auto data = test::random_bytes(40000, 21);
  test::write_file(dir / "f.bin", data);
  FileOptions options;
  options.settings.set("task_size", "16KiB");  // three tasks a read, on the shared pool
  std::vector<unsigned char> buf(data.size());
  auto cycle = [&](int i) {
    FileOptions o = options;
    o.direct = i % 4 == 0;  // a quarter through O_DIRECT and the staging pool
    File f(dir / "f.bin", "r", o);
    std::size_t off = static_cast<std::size_t>(i % 7) * 1000;
    ASSERT_EQ(f.read(buf.data(), data.size() - off, off), data.size() - off);
    ASSERT_EQ(buf[0], data[off]);
  };
  for (int i = 0; i < 200; ++i) cycle(i);  // warm up: the pool, the staging buffers, stats
  const std::size_t fds = open_fds(), others = threads() - pool_threads(), rss = rss_kib();
  for (int i = 0; i < kCycles; ++i) {
    cycle(i);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(open_fds(), fds);
  EXPECT_EQ(threads() - pool_threads(), others) << "threads outside ferry's pools";
  EXPECT_LE(backends::default_runtime().pool().size(), kHostThreadsDefault);
  if (!sanitized()) {
    EXPECT_LT(rss_kib(), rss + 8 * 1024) << "RSS grew by more than 8 MiB";
  }
}

TEST(Hygiene, WritesAndAsyncRequestsLeakNothing) {
  TempDir dir;
  auto data = test::random_bytes(20000, 22);
  FileOptions options;
  options.settings.set("task_size", "8KiB");
  std::vector<unsigned char> buf(data.size());
  auto cycle = [&](int i) {
    File f(dir / "w.bin", "w+", options);
    IoFuture w = f.pwrite(data.data(), data.size(), 0);
    ASSERT_EQ(w.get(), data.size());
    IoFuture r = f.pread(buf.data(), buf.size(), 0);
    r.wait();
    if (i % 2 == 0) f.close();  // closed while its future is still held
    ASSERT_EQ(r.get(), data.size());
  };
  for (int i = 0; i < 100; ++i) cycle(i);
  const std::size_t fds = open_fds(), others = threads() - pool_threads();
  for (int i = 0; i < kCycles / 4; ++i) {
    cycle(i);
    if (HasFatalFailure()) return;
  }
  EXPECT_EQ(open_fds(), fds);
  EXPECT_EQ(threads() - pool_threads(), others) << "threads outside ferry's pools";
  EXPECT_LE(backends::default_runtime().pool().size(), kHostThreadsDefault);
}

TEST(Hygiene, FailedOpensAndRequestsLeakNoDescriptors) {
  TempDir dir;
  test::write_file(dir / "f.bin", {1, 2, 3});
  ASSERT_EQ(mkfifo((dir / "fifo").c_str(), 0600), 0);
  const std::size_t fds = open_fds();
  for (int i = 0; i < kCycles / 4; ++i) {
    EXPECT_THROW(File(dir / "missing"), IoError);
    EXPECT_THROW(File(dir.path()), IoError);  // opened, then refused: must be closed again
    EXPECT_THROW(File(dir / "fifo"), IoError);
    EXPECT_THROW(File(dir / "f.bin", "bad-mode"), Error);
    File f(dir / "f.bin");
    EXPECT_THROW(f.read(nullptr, 3, 0), IoError);
    EXPECT_THROW(f.write("x", 1, 0), IoError);
  }
  EXPECT_EQ(open_fds(), fds);
}

}  // namespace
}  // namespace ferry
