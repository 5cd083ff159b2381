// Requests and buffers at the edges: size 0, offsets at and past the end of the file, offsets and
// sizes that overflow off_t, null and unmapped buffers. Each either has a defined result or an
// IoError naming the file; none crashes or hangs. Complements tests/posix/file_error_test.cc.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <limits>

#include "ferry/ferry.h"
#include "test_util.h"

namespace ferry {
namespace {

using test::TempDir;

template <typename Body>
IoError expect_io_error(Body body, int err) {
  try {
    body();
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), err) << e.what();
    return e;
  }
  ADD_FAILURE() << "no IoError";
  return IoError(0, "", "", 0, 0);
}

class BadRequests : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (dir_ / "f.bin").string();
    data_ = test::random_bytes(100000, 11);
    test::write_file(path_, data_);
  }
  TempDir dir_;
  std::string path_;
  std::vector<unsigned char> data_;
};

TEST_F(BadRequests, SizeZeroMovesNothingAndSucceeds) {
  File f(path_, "r+");
  unsigned char b = 0;
  EXPECT_EQ(f.read(&b, 0, 0), 0u);
  EXPECT_EQ(f.write(&b, 0, 0), 0u);
  EXPECT_EQ(f.read(nullptr, 0, 50), 0u);  // a null buffer is fine when nothing is moved
  EXPECT_EQ(f.write(nullptr, 0, 50), 0u);
  EXPECT_EQ(f.size(), data_.size());
}

TEST_F(BadRequests, ReadAtOrPastEndOfFileReturnsZeroBytes) {
  File f(path_);
  std::vector<unsigned char> buf(4096, 0xAB);
  EXPECT_EQ(f.read(buf.data(), buf.size(), data_.size()), 0u);
  EXPECT_EQ(f.read(buf.data(), buf.size(), data_.size() + 1), 0u);
  EXPECT_EQ(f.read(buf.data(), buf.size(), std::uint64_t{1} << 50), 0u);
  EXPECT_EQ(buf, std::vector<unsigned char>(4096, 0xAB)) << "a read of 0 bytes wrote the buffer";
}

TEST_F(BadRequests, ReadAcrossEndOfFileStopsThere) {
  File f(path_);
  std::vector<unsigned char> buf(8192, 0xAB);
  EXPECT_EQ(f.read(buf.data(), buf.size(), data_.size() - 100), 100u);
  EXPECT_EQ(0, std::memcmp(buf.data(), data_.data() + data_.size() - 100, 100));
  EXPECT_EQ(buf[100], 0xAB);
}

TEST_F(BadRequests, WritePastEndOfFileLeavesAHoleOfZeros) {
  File f(path_, "r+");
  unsigned char b[4] = {1, 2, 3, 4};
  const std::uint64_t at = data_.size() + 5000;
  EXPECT_EQ(f.write(b, 4, at), 4u);
  auto back = test::read_file(path_);
  ASSERT_EQ(back.size(), at + 4);
  EXPECT_EQ(std::vector<unsigned char>(back.begin() + data_.size(), back.begin() + at),
            std::vector<unsigned char>(5000, 0));
}

TEST_F(BadRequests, OffsetBeyondOffTIsAnError) {
  File f(path_, "r+");
  unsigned char b[4] = {};
  const std::uint64_t huge = std::numeric_limits<std::uint64_t>::max();
  IoError e = expect_io_error([&] { f.read(b, 4, huge); }, EOVERFLOW);
  EXPECT_EQ(e.path(), path_);
  EXPECT_EQ(e.offset(), huge);
  expect_io_error([&] { f.write(b, 4, std::uint64_t{LLONG_MAX} + 1); }, EOVERFLOW);
}

TEST_F(BadRequests, SizeBeyondOffTIsAnErrorEvenAtOffsetZero) {
  File f(path_, "r+");
  unsigned char b[4] = {};
  const std::size_t huge = std::numeric_limits<std::size_t>::max();
  expect_io_error([&] { f.read(b, huge, 0); }, EOVERFLOW);
  expect_io_error([&] { f.write(b, huge, 0); }, EOVERFLOW);
}

TEST_F(BadRequests, WriteWhoseEndOverflowsOffTIsAnError) {
  File f(path_, "r+");
  unsigned char b[4] = {};
  expect_io_error([&] { f.write(b, 4, std::uint64_t{LLONG_MAX} - 1); }, EOVERFLOW);
  EXPECT_EQ(f.size(), data_.size()) << "a refused write changed the file";
}

TEST_F(BadRequests, RequestAtTheLastOffTOffsetWithSizeZeroIsFine) {
  File f(path_);
  unsigned char b = 0;
  EXPECT_EQ(f.read(&b, 0, std::uint64_t{LLONG_MAX}), 0u);
}

TEST_F(BadRequests, NullBufferForAWriteIsAnError) {
  File f(path_, "r+");
  IoError e = expect_io_error([&] { f.write(nullptr, 10, 0); }, EFAULT);
  EXPECT_EQ(e.path(), path_);
  EXPECT_EQ(test::read_file(path_), data_);
}

// An address the process may not write is caught by the kernel: the request fails with EFAULT,
// the process lives. (PROT_NONE keeps the range reserved: an unmapped one may be reused by the
// allocator before the read.)
// (A buffer that is mapped but too small cannot be detected for a raw pointer: ferry writes
// past it, as pread(2) would. ASan reports it in the sanitizer builds.)
TEST_F(BadRequests, InaccessibleBufferGivesEfaultNotACrash) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, 4 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  FileOptions options;
  options.settings.set("task_size", "4KiB");
  File f(path_, "r+", options);
  IoError r = expect_io_error([&] { f.read(p, 4 * page, 0); }, EFAULT);
  EXPECT_EQ(r.path(), path_);
  EXPECT_EQ(r.op(), "pread");
  expect_io_error([&] { f.write(p, 4 * page, 0); }, EFAULT);
  EXPECT_EQ(test::read_file(path_), data_);
  // The pool and the file stay usable.
  std::vector<unsigned char> buf(data_.size());
  EXPECT_EQ(f.read(buf.data(), buf.size(), 0), data_.size());
  munmap(p, 4 * page);
}

TEST_F(BadRequests, FutureOfAFailedRequestRethrowsEveryTime) {
  File f(path_);
  IoFuture fut = f.pread(nullptr, 10, 0);
  EXPECT_TRUE(fut.ready());
  EXPECT_THROW(fut.get(), IoError);
  EXPECT_THROW(fut.get(), IoError);
  EXPECT_EQ(fut.route().bytes, 0u);
}

TEST_F(BadRequests, DefaultConstructedFileAndFutureThrowInsteadOfCrashing) {
  File f;
  unsigned char b = 0;
  EXPECT_THROW(f.read(&b, 1, 0), IoError);
  EXPECT_THROW(f.size(), IoError);
  EXPECT_THROW(f.sync(), IoError);
  EXPECT_FALSE(f.is_open());
  IoFuture fut;
  EXPECT_FALSE(fut.valid());
  EXPECT_THROW(fut.get(), Error);
  EXPECT_THROW(fut.wait(), Error);
}

}  // namespace
}  // namespace ferry
