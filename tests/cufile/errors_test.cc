// cuFile failures become IoError naming the call, file, offset, length and cuFile's words.
#include <gtest/gtest.h>

#include "fake_cufile_env.h"
#include "ferry/error.h"

namespace ferry {
namespace {

using test::DataFile;
using test::kMiB;

TEST(CufileErrors, NegativeCufileCodeBecomesIoError) {
  test::use_fake_cufile();
  setenv("FERRY_FAKE_CUFILE_IO_RESULT", "-5044", 1);
  DataFile f(4 * kMiB);
  std::vector<unsigned char> buf(4 * kMiB);
  File file(f.path(), "r", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
  try {
    file.read(buf.data(), buf.size());
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.op(), "cuFileRead");
    EXPECT_EQ(e.path(), f.path().string());
    EXPECT_EQ(e.offset(), 0u);
    EXPECT_EQ(e.length(), 4 * kMiB);
    EXPECT_EQ(std::string(e.what()),
              "cuFileRead " + f.path().string() + " offset=0 len=4194304: error 5044 (I/O error)");
  }
  unsetenv("FERRY_FAKE_CUFILE_IO_RESULT");
  RouteReport r = file.last_route();
  EXPECT_EQ(r.cufile_tasks, 1u);
}

TEST(CufileErrors, MinusOneUsesErrno) {
  test::use_fake_cufile();
  setenv("FERRY_FAKE_CUFILE_IO_RESULT", "-1", 1);
  DataFile f(4 * kMiB);
  std::vector<unsigned char> buf(4 * kMiB);
  File file(f.path(), "r", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
  try {
    file.read(buf.data(), buf.size());
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EIO);
    EXPECT_NE(std::string(e.what()).find("Input/output error (errno 5)"), std::string::npos)
        << e.what();
  }
  unsetenv("FERRY_FAKE_CUFILE_IO_RESULT");
}

TEST(CufileErrors, FailureMidRequestCarriesBytesDone) {
  test::use_fake_cufile();
  setenv("FERRY_FAKE_CUFILE_IO_RESULT", "-5044", 1);
  setenv("FERRY_FAKE_CUFILE_IO_FAIL_FROM", "8388608", 1);
  DataFile f(16 * kMiB);
  std::vector<unsigned char> buf(16 * kMiB);
  SettingsOverride s = test::with(4 * kMiB);
  s.nthreads = 1;
  File file(f.path(), "r", {false, s, test::fake_gpu_runtime()});
  try {
    file.read(buf.data(), buf.size());
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.offset(), 8 * kMiB);
    EXPECT_EQ(e.bytes_done(), 8 * kMiB);
  }
  unsetenv("FERRY_FAKE_CUFILE_IO_RESULT");
  unsetenv("FERRY_FAKE_CUFILE_IO_FAIL_FROM");
  EXPECT_TRUE(std::equal(buf.begin(), buf.begin() + 8 * kMiB, f.data().begin()));
}

TEST(CufileErrors, WriteFailureNamesCufileWrite) {
  test::use_fake_cufile();
  setenv("FERRY_FAKE_CUFILE_IO_RESULT", "-5044", 1);
  test::TempDir dir(std::filesystem::current_path().string());
  auto data = test::random_bytes(4 * kMiB, 1);
  File out(dir / "w.bin", "w", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
  try {
    out.write(data.data(), data.size());
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_EQ(e.op(), "cuFileWrite");
  }
  unsetenv("FERRY_FAKE_CUFILE_IO_RESULT");
}

}  // namespace
}  // namespace ferry
