// Layer 1 with the test double: which requests go to cuFile, which to ferry's POSIX path, and
// the reason, with the data checked byte for byte each time.
#include <gtest/gtest.h>

#include "fake_cufile_env.h"
#include "ferry/cufile.h"
#include "ferry/error.h"

namespace ferry {
namespace {

using test::DataFile;
using test::kMiB;

RouteReport read_all(const DataFile& f, const SettingsOverride& s, std::size_t size,
                     std::uint64_t offset = 0) {
  std::vector<unsigned char> buf(size);
  File file(f.path(), "r", {false, s, test::fake_gpu_runtime()});
  std::size_t n = file.read(buf.data(), size, offset);
  EXPECT_EQ(n, size);
  EXPECT_TRUE(std::equal(buf.begin(), buf.end(), f.data().begin() + offset)) << "data differs";
  return file.last_route();
}

// Tasks below the double's 8 MiB piece (tests/fake_cufile): one piece each. 1 MiB tasks show it
// as 4 MiB ones did, in a quarter of the bytes (64 MiB took 12.5 s under TSan).
TEST(CufileRouting, SmallTasksEachBecomeOneCufileRequest) {
  test::use_fake_cufile();
  DataFile f(16 * kMiB);
  RouteReport r = read_all(f, test::with(1 * kMiB), 16 * kMiB);
  EXPECT_EQ(r.tasks, 16u);
  EXPECT_EQ(r.cufile_tasks, 16u);
  EXPECT_EQ(r.posix_tasks, 0u);
  EXPECT_EQ(test::fake_read_calls(), 16);
  ASSERT_TRUE(r.cufile.observable) << r.cufile.why_not;
  EXPECT_EQ(r.cufile.posix, 16u);
  EXPECT_EQ(r.cufile.nvfs, 0u);
  EXPECT_EQ(r.cufile.p2p, 0u);
}

// The most pieces cuFile cuts a request into (max_request_parallelism, 4): 32 MiB is four of
// the double's 8 MiB pieces, as 64 MiB was, in half the bytes.
TEST(CufileRouting, OneLargeTaskIsCutIntoFourPieces) {
  test::use_fake_cufile();
  DataFile f(32 * kMiB);
  RouteReport r = read_all(f, test::with(32 * kMiB), 32 * kMiB);
  EXPECT_EQ(r.cufile_tasks, 1u);
  EXPECT_EQ(r.cufile.posix, 4u);
}

TEST(CufileRouting, SixteenMiBRequestIsCutIntoTwoPieces) {
  test::use_fake_cufile();
  DataFile f(16 * kMiB);
  RouteReport r = read_all(f, test::with(16 * kMiB), 16 * kMiB);
  EXPECT_EQ(r.cufile_tasks, 1u);
  EXPECT_EQ(r.cufile.posix, 2u);
}

TEST(CufileRouting, BelowThresholdGoesToPosixWithoutCallingCufile) {
  test::use_fake_cufile();
  DataFile f(1 * kMiB);
  RouteReport r = read_all(f, test::with(4 * kMiB, CompatMode::kAuto), 8192, 4096);
  EXPECT_EQ(r.cufile_tasks, 0u);
  EXPECT_EQ(r.posix_tasks, 1u);
  ASSERT_FALSE(r.reasons.empty());
  EXPECT_EQ(r.reasons[0].code, ReasonCode::kBelowThreshold);
  EXPECT_EQ(r.reasons[0].text, "request 8192 B below gds_threshold 16384 B");
  EXPECT_EQ(test::fake_read_calls(), 0);
}

TEST(CufileRouting, CompatOnNeverCallsCufile) {
  test::use_fake_cufile();
  DataFile f(16 * kMiB);
  RouteReport r = read_all(f, test::with(4 * kMiB, CompatMode::kOn), 16 * kMiB);
  EXPECT_EQ(r.cufile_tasks, 0u);
  EXPECT_EQ(r.posix_tasks, 4u);
  EXPECT_EQ(r.reasons[0].code, ReasonCode::kCompatModeOn);
  EXPECT_EQ(test::fake_read_calls(), 0);
  EXPECT_FALSE(cufile_status(false).driver_open_attempted);
}

TEST(CufileRouting, HostBufferGoesToPosix) {
  test::use_fake_cufile();
  test::FakeMachine::get().host_as_gpu(false);
  DataFile f(8 * kMiB);
  RouteReport r = read_all(f, test::with(4 * kMiB), 8 * kMiB);
  EXPECT_EQ(r.cufile_tasks, 0u);
  EXPECT_EQ(test::fake_read_calls(), 0);
}

TEST(CufileRouting, HandleRegisterFailureFallsBackWithTheReason) {
  test::use_fake_gds_machine();
  setenv("FERRY_FAKE_CUFILE_HANDLE_ERROR", "5027", 1);
  DataFile f(8 * kMiB);
  RouteReport r = read_all(f, test::with(4 * kMiB, CompatMode::kAuto), 8 * kMiB);
  unsetenv("FERRY_FAKE_CUFILE_HANDLE_ERROR");
  EXPECT_EQ(r.cufile_tasks, 0u);
  EXPECT_EQ(r.posix_tasks, 2u);
  ASSERT_FALSE(r.reasons.empty());
  EXPECT_EQ(r.reasons[0].code, ReasonCode::kCufileUnavailable);
  std::string expected = "cuFileHandleRegister failed for " + f.path().string() +
                         ": error 5027 (file descriptor is not registered)";
  EXPECT_EQ(r.reasons[0].text.substr(0, expected.size()), expected) << r.reasons[0].text;
  EXPECT_NE(r.reasons[0].text.find("udev"), std::string::npos);
  EXPECT_EQ(test::fake_read_calls(), 0);
}

TEST(CufileRouting, CompatOffFailsInsteadOfFallingBack) {
  test::use_fake_cufile();
  setenv("FERRY_FAKE_CUFILE_HANDLE_ERROR", "5027", 1);
  DataFile f(8 * kMiB);
  std::vector<unsigned char> buf(8 * kMiB, 0xab);
  File file(f.path(), "r",
            {false, test::with(4 * kMiB, CompatMode::kOff), test::fake_gpu_runtime()});
  try {
    file.read(buf.data(), buf.size());
    FAIL() << "expected RouteError";
  } catch (const RouteError& e) {
    EXPECT_NE(std::string(e.what()).find("compat_mode=off requires cuFile"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("error 5027"), std::string::npos) << e.what();
  }
  unsetenv("FERRY_FAKE_CUFILE_HANDLE_ERROR");
  EXPECT_EQ(buf[0], 0xab);
}

TEST(CufileRouting, DriverOpenFailureFallsBackWithItsCode) {
  setenv("FERRY_FAKE_CUFILE_DRIVER_OPEN_ERROR", "5001", 1);
  test::use_fake_gds_machine();
  DataFile f(8 * kMiB);
  RouteReport r = read_all(f, test::with(4 * kMiB, CompatMode::kAuto), 8 * kMiB);
  unsetenv("FERRY_FAKE_CUFILE_DRIVER_OPEN_ERROR");
  EXPECT_EQ(r.cufile_tasks, 0u);
  EXPECT_EQ(r.reasons[0].code, ReasonCode::kCufileUnavailable);
  EXPECT_NE(r.reasons[0].text.find("error 5001"), std::string::npos) << r.reasons[0].text;
}

// Issue 9: where cuFile could only use its compatibility path, auto mode takes ferry's POSIX path
// without opening cuFile's driver (it used to cost 0.5 s per process on the GPU machine).
TEST(CufileRouting, AutoWithoutNvidiaFsNeverOpensTheDriverAndSaysWhy) {
  test::use_fake_cufile();  // captured tree without nvidia-fs
  test::FakeMachine::get().set_resident_fraction(0.0);
  DataFile f(8 * kMiB);
  RouteReport r = read_all(f, test::with(4 * kMiB, CompatMode::kAuto), 8 * kMiB);
  EXPECT_EQ(r.cufile_tasks, 0u);
  EXPECT_EQ(r.posix_tasks, 2u);
  ASSERT_FALSE(r.reasons.empty());
  EXPECT_EQ(r.reasons[0].code, ReasonCode::kCufileCompatOnly);
  EXPECT_NE(r.reasons[0].text.find("nvidia-fs kernel module is not loaded"), std::string::npos)
      << r.reasons[0].text;
  EXPECT_NE(r.reasons[0].text.find("compat_mode=off forces cuFile"), std::string::npos);
  EXPECT_FALSE(cufile_status(false).driver_open_attempted);
  EXPECT_EQ(test::fake_read_calls(), 0);
}

TEST(CufileRouting, CompatOffStillReachesCufileWithoutNvidiaFs) {
  test::use_fake_cufile();
  DataFile f(8 * kMiB);
  RouteReport r = read_all(f, test::with(4 * kMiB, CompatMode::kOff), 8 * kMiB);
  EXPECT_EQ(r.cufile_tasks, 2u);
  EXPECT_EQ(test::fake_read_calls(), 2);
}

// Issue 9: on a machine where nvidia-fs could serve the file, auto mode sends a cold range to
// cuFile and a resident one through the page cache, and says which.
TEST(CufileRouting, AutoSendsColdRangesToCufileAndResidentOnesThroughThePageCache) {
  test::use_fake_gds_machine();
  setenv("FERRY_FAKE_CUFILE_NVFS", "1", 1);
  DataFile f(16 * kMiB);
  RouteReport cold = read_all(f, test::with(4 * kMiB, CompatMode::kAuto), 16 * kMiB);
  EXPECT_EQ(cold.cufile_tasks, 4u);
  EXPECT_EQ(cold.page_cache.resident, 0u);
  EXPECT_EQ(cold.cufile.nvfs, 4u);

  test::FakeMachine::get().set_resident_fraction(0.5);
  RouteReport warm = read_all(f, test::with(4 * kMiB, CompatMode::kAuto), 16 * kMiB);
  unsetenv("FERRY_FAKE_CUFILE_NVFS");
  EXPECT_EQ(warm.cufile_tasks, 0u);
  EXPECT_EQ(warm.posix_tasks, 4u);
  ASSERT_FALSE(warm.reasons.empty());
  EXPECT_EQ(warm.reasons[0].code, ReasonCode::kPageCacheResident);
  EXPECT_NE(warm.reasons[0].text.find("8 MiB of 16 MiB resident (50%, test)"), std::string::npos)
      << warm.reasons[0].text;
  EXPECT_EQ(warm.page_cache.resident, 8 * kMiB);
  EXPECT_EQ(test::fake_read_calls(), 4) << "only the cold read reached cuFile";
}

TEST(CufileRouting, StrictModeStillInsistsOnCufileForResidentRanges) {
  test::use_fake_gds_machine();
  test::FakeMachine::get().set_resident_fraction(1.0);
  DataFile f(8 * kMiB);
  RouteReport r = read_all(f, test::with(4 * kMiB, CompatMode::kAuto, Require::kCufile), 8 * kMiB);
  EXPECT_EQ(r.cufile_tasks, 2u);
}

TEST(CufileRouting, ProbeResultIsCachedPerFile) {
  test::use_fake_gds_machine();
  DataFile f(8 * kMiB);
  std::vector<unsigned char> buf(8 * kMiB);
  setenv("FERRY_FAKE_CUFILE_HANDLE_ERROR", "5027", 1);
  File first(f.path(), "r",
             {false, test::with(4 * kMiB, CompatMode::kAuto), test::fake_gpu_runtime()});
  first.read(buf.data(), buf.size());
  unsetenv("FERRY_FAKE_CUFILE_HANDLE_ERROR");
  first.read(buf.data(), buf.size());
  EXPECT_EQ(first.last_route().cufile_tasks, 0u) << "the first answer is kept for this File";
  File second(f.path(), "r",
              {false, test::with(4 * kMiB, CompatMode::kAuto), test::fake_gpu_runtime()});
  second.read(buf.data(), buf.size());
  EXPECT_EQ(second.last_route().cufile_tasks, 2u) << "a new File asks again";
  EXPECT_EQ(buf, f.data());
}

TEST(CufileRouting, UnalignedOffsetAndShortReadAtEndOfFile) {
  test::use_fake_cufile();
  DataFile f(10 * kMiB + 123);
  std::vector<unsigned char> buf(12 * kMiB);
  File file(f.path(), "r", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
  std::size_t n = file.read(buf.data(), buf.size(), 777);
  ASSERT_EQ(n, f.data().size() - 777);
  EXPECT_TRUE(std::equal(buf.begin(), buf.begin() + n, f.data().begin() + 777));
  EXPECT_EQ(file.last_route().cufile_tasks, 3u);
}

TEST(CufileRouting, WritesGoThroughCufileWrite) {
  test::use_fake_cufile();
  test::TempDir dir(std::filesystem::current_path().string());
  auto data = test::random_bytes(32 * kMiB, 3);
  {
    File out(dir / "w.bin", "w", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
    ASSERT_EQ(out.write(data.data(), data.size()), data.size());
    RouteReport r = out.last_route();
    EXPECT_EQ(r.op, Op::kWrite);
    EXPECT_EQ(r.cufile_tasks, 8u);
    EXPECT_EQ(r.cufile.posix, 8u);
  }
  EXPECT_EQ(test::fake_write_calls(), 8);
  EXPECT_EQ(test::read_file(dir / "w.bin"), data);
}

TEST(CufileRouting, AScatteredWriteGoesThroughCufileWriteAsOneRequest) {
  test::use_fake_cufile();
  test::TempDir dir(std::filesystem::current_path().string());
  auto a = test::random_bytes(8 * kMiB, 4);
  auto b = test::random_bytes(4 * kMiB + 100, 5);
  const WriteRange ranges[] = {{20 * kMiB, b.size(), b.data()}, {0, a.size(), a.data()}};
  {
    File out(dir / "s.bin", "w", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
    ASSERT_EQ(out.pwrite_scatter(ranges).get(), a.size() + b.size());
    RouteReport r = out.last_route();
    EXPECT_EQ(r.op, Op::kWrite);
    EXPECT_EQ(r.ranges, 2u);
    EXPECT_EQ(r.cufile_tasks, 2u + 2u) << r.to_text();  // 8 MiB, and 4 MiB + 100 B
    EXPECT_EQ(r.cufile.posix, 4u);
  }
  EXPECT_EQ(test::fake_write_calls(), 4);
  auto bytes = test::read_file(dir / "s.bin");
  ASSERT_EQ(bytes.size(), 20 * kMiB + b.size());
  EXPECT_EQ(0, std::memcmp(bytes.data(), a.data(), a.size()));
  EXPECT_EQ(0, std::memcmp(bytes.data() + 20 * kMiB, b.data(), b.size()));
}

TEST(CufileRouting, RegisteredBufferIsPassedAsBasePlusOffset) {
  test::use_fake_cufile();
  DataFile f(16 * kMiB);
  std::vector<unsigned char> buf(20 * kMiB);
  RegisteredBuffer reg = register_buffer(buf.data(), buf.size());
  ASSERT_TRUE(reg.registered());
  File file(f.path(), "r", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
  // Into the middle of the registered buffer: cuFile gets the base and an offset.
  ASSERT_EQ(file.read(buf.data() + 3 * kMiB, 16 * kMiB), 16 * kMiB);
  EXPECT_TRUE(std::equal(f.data().begin(), f.data().end(), buf.begin() + 3 * kMiB));
  RouteReport r = file.last_route();
  EXPECT_EQ(r.cufile_tasks, 4u);
  EXPECT_NE(r.to_text().find("), registered buffer"), std::string::npos) << r.to_text();
  reg.reset();
  EXPECT_FALSE(reg.registered());
}

}  // namespace
}  // namespace ferry
