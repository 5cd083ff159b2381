// The dlopen loader and the driver lifecycle, on the test double.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fake_cufile_env.h"
#include "ferry/cufile.h"
#include "ferry/error.h"

namespace ferry {
namespace {

using test::DataFile;
using test::kMiB;

TEST(CufileLoader, MissingLibraryIsNamedAndReadsFallBack) {
  test::use_fake_gds_machine("/nonexistent/libcufile.so.0");
  CufileStatus s = cufile_status();
  EXPECT_FALSE(s.loaded);
  EXPECT_EQ(s.load_error, "/nonexistent/libcufile.so.0 not found");
  EXPECT_FALSE(s.driver_open_attempted);

  DataFile f(8 * kMiB);
  std::vector<unsigned char> buf(8 * kMiB);
  File file(f.path(), "r",
            {false, test::with(4 * kMiB, CompatMode::kAuto), test::fake_gpu_runtime()});
  ASSERT_EQ(file.read(buf.data(), buf.size()), buf.size());
  EXPECT_EQ(buf, f.data());
  RouteReport r = file.last_route();
  EXPECT_EQ(r.cufile_tasks, 0u);
  ASSERT_FALSE(r.reasons.empty());
  EXPECT_EQ(r.reasons[0].code, ReasonCode::kCufileUnavailable);
  EXPECT_EQ(r.reasons[0].text, "/nonexistent/libcufile.so.0 not found");
}

TEST(CufileLoader, MissingSymbolIsNamed) {
  test::use_fake_cufile(FERRY_FAKE_CUFILE_NO_READ);
  CufileStatus s = cufile_status();
  EXPECT_FALSE(s.loaded);
  EXPECT_NE(s.load_error.find("lacks symbols: cuFileRead"), std::string::npos) << s.load_error;
  EXPECT_EQ(s.missing_symbols, std::vector<std::string>{"cuFileRead"});
}

TEST(CufileLoader, StatusReportsVersionAndOpensTheDriver) {
  test::use_fake_cufile();
  CufileStatus before = cufile_status(false);
  EXPECT_TRUE(before.loaded);
  EXPECT_FALSE(before.driver_open_attempted);
  CufileStatus s = cufile_status();
  EXPECT_EQ(s.version, 1150);
  EXPECT_EQ(s.version_text, "1.15");
  EXPECT_TRUE(s.stats_layout_known);
  EXPECT_TRUE(s.driver_open);
  EXPECT_FALSE(s.compat_mode_refused);
  EXPECT_EQ(s.stats_why_not, "");
  EXPECT_TRUE(s.missing_symbols.empty());
  auto j = nlohmann::json::parse(s.to_json());
  EXPECT_EQ(j["version"], 1150);
  EXPECT_EQ(j["driver_open"], true);
}

TEST(CufileLoader, DriverOpensLazilyOnFirstCufileRequest) {
  test::use_fake_gds_machine();
  DataFile f(1 * kMiB);
  std::vector<unsigned char> buf(8192);
  File file(f.path(), "r",
            {false, test::with(4 * kMiB, CompatMode::kAuto), test::fake_gpu_runtime()});
  file.read(buf.data(), buf.size());  // below gds_threshold: cuFile is not needed
  EXPECT_FALSE(cufile_status(false).driver_open_attempted);
  std::vector<unsigned char> big(1 * kMiB);
  file.read(big.data(), big.size());
  EXPECT_TRUE(cufile_status(false).driver_open);
  EXPECT_EQ(file.last_route().cufile_tasks, 1u);
}

TEST(CufileLoader, DriverOpenFailureIsKeptWithCodeAndText) {
  setenv("FERRY_FAKE_CUFILE_DRIVER_OPEN_ERROR", "5001", 1);
  test::use_fake_cufile();
  CufileStatus s = cufile_status();
  EXPECT_TRUE(s.driver_open_attempted);
  EXPECT_FALSE(s.driver_open);
  EXPECT_EQ(s.driver_error, 5001);
  EXPECT_NE(
      s.driver_error_text.find("cuFileDriverOpen failed: error 5001 (driver not initialized)"),
      std::string::npos)
      << s.driver_error_text;
  EXPECT_NE(s.driver_error_text.find("nvidia-fs kernel module is not loaded"), std::string::npos);
  unsetenv("FERRY_FAKE_CUFILE_DRIVER_OPEN_ERROR");
}

TEST(CufileLoader, HandlesAreDeregisteredWhenTheFileCloses) {
  test::use_fake_cufile();
  DataFile f(4 * kMiB);
  std::vector<unsigned char> buf(4 * kMiB);
  {
    File file(f.path(), "r", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
    file.read(buf.data(), buf.size());
    EXPECT_EQ(test::fake_open_handles(), 1);
  }
  EXPECT_EQ(test::fake_open_handles(), 0);
}

TEST(CufileLoader, ProcessExitsCleanlyWithTheDriverOpen) {
  EXPECT_EXIT(
      {
        test::use_fake_cufile();
        DataFile f(4 * kMiB);
        std::vector<unsigned char> buf(4 * kMiB);
        File file(f.path(), "r", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
        file.read(buf.data(), buf.size());
        std::exit(file.last_route().cufile_tasks == 1 ? 0 : 3);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace ferry
