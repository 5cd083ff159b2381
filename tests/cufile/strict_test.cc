// Strict mode (require=gds and require=cufile) on the test double.
#include <gtest/gtest.h>

#include <optional>
#include <thread>

#include "fake_cufile_env.h"
#include "ferry/cufile.h"
#include "ferry/error.h"
#include "ferry/stats.h"

namespace ferry {
namespace {

using test::DataFile;
using test::kMiB;

TEST(CufileStrict, GdsFailsBeforeAnyIoNamingTheMissingModule) {
  test::use_fake_cufile();
  DataFile f(16 * kMiB);
  std::vector<unsigned char> buf(16 * kMiB, 0xab);
  File file(
      f.path(), "r",
      {false, test::with(4 * kMiB, CompatMode::kAuto, Require::kGds), test::fake_gpu_runtime()});
  try {
    file.read(buf.data(), buf.size());
    FAIL() << "expected RouteError";
  } catch (const RouteError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("require=gds"), std::string::npos) << what;
    EXPECT_NE(what.find("compatibility mode refused"), std::string::npos) << what;
    EXPECT_NE(what.find("error 5001"), std::string::npos) << what;
    EXPECT_NE(what.find("nvidia-fs kernel module is not loaded"), std::string::npos) << what;
  }
  EXPECT_EQ(test::fake_read_calls(), 0);
  EXPECT_EQ(buf[0], 0xab);
  CufileStatus s = cufile_status(false);
  EXPECT_FALSE(s.driver_open);
  EXPECT_EQ(s.driver_error, 5001);
}

TEST(CufileStrict, GdsAcceptsRequestsServedByNvidiaFs) {
  setenv("FERRY_FAKE_CUFILE_NVFS", "1", 1);
  test::use_fake_cufile();
  DataFile f(16 * kMiB);
  std::vector<unsigned char> buf(16 * kMiB);
  File file(
      f.path(), "r",
      {false, test::with(4 * kMiB, CompatMode::kAuto, Require::kGds), test::fake_gpu_runtime()});
  ASSERT_EQ(file.read(buf.data(), buf.size()), buf.size());
  EXPECT_EQ(buf, f.data());
  RouteReport r = file.last_route();
  EXPECT_EQ(r.cufile.nvfs, 4u);
  EXPECT_EQ(r.cufile.posix, 0u);
  EXPECT_TRUE(cufile_status(false).compat_mode_refused);
  EXPECT_EQ(r.verdict(),
            "4 request(s) went to cuFile; cuFile served all 4 piece(s) through nvidia-fs");
  unsetenv("FERRY_FAKE_CUFILE_NVFS");
}

TEST(CufileStrict, GdsFailsRequestWhoseLayer2ShowsCompatPieces) {
  test::use_fake_cufile();
  reset_stats();
  DataFile f(16 * kMiB);
  std::vector<unsigned char> buf(16 * kMiB);
  // A lenient request opens the driver with compatibility allowed...
  File lenient(f.path(), "r", {false, test::with(4 * kMiB), test::fake_gpu_runtime()});
  lenient.read(buf.data(), buf.size());
  // ...so a strict one can only be judged by what cuFile counted.
  File strict(
      f.path(), "r",
      {false, test::with(4 * kMiB, CompatMode::kAuto, Require::kGds), test::fake_gpu_runtime()});
  try {
    strict.read(buf.data(), buf.size());
    FAIL() << "expected RouteError";
  } catch (const RouteError& e) {
    EXPECT_STREQ(e.what(),
                 "require=gds refuses cuFile's non-nvidia-fs paths: of 4 piece(s), cuFile served 4 "
                 "through its POSIX compatibility path and 0 through PCI P2PDMA (the nvidia-fs "
                 "module is not loaded)");
  }
  RouteReport r = strict.last_route();
  EXPECT_EQ(r.cufile.posix, 4u);
  EXPECT_EQ(stats().failed_requests, 1u);
}

// Issue 11: a strict request served by nvidia-fs must not fail because a neighbour's pieces went
// through the compatibility path in the same window of cuFile's process-wide counters (it did:
// the strict request was failed after its I/O by the other request's pieces).
TEST(CufileStrict, GdsNeverFailsARequestBecauseOfAnotherRequestsPieces) {
  setenv("FERRY_FAKE_CUFILE_NVFS", "1", 1);
  setenv("FERRY_FAKE_CUFILE_POSIX_FILES", "posix-only", 1);
  setenv("FERRY_FAKE_CUFILE_DELAY_US", "20000", 1);
  test::use_fake_cufile();
  DataFile f(16 * kMiB);
  const auto posix_path = f.path().parent_path() / "posix-only.bin";
  std::filesystem::copy_file(f.path(), posix_path);
  SettingsOverride strict_settings = test::with(4 * kMiB, CompatMode::kAuto, Require::kGds);
  strict_settings.nthreads = 1;
  SettingsOverride other_settings = test::with(4 * kMiB);
  other_settings.nthreads = 1;
  File strict(f.path(), "r", {false, strict_settings, test::fake_gpu_runtime()});
  File other(posix_path, "r", {false, other_settings, test::fake_gpu_runtime()});
  std::vector<unsigned char> a(16 * kMiB), b(16 * kMiB);
  IoFuture fa = strict.pread(a.data(), a.size());
  IoFuture fb = other.pread(b.data(), b.size());  // runs while the strict one does
  EXPECT_EQ(fb.get(), b.size());
  ASSERT_NO_THROW(fa.get()) << "a request served by nvidia-fs was failed by another's pieces";
  EXPECT_EQ(a, f.data());
  RouteReport r = fa.route();
  EXPECT_TRUE(r.cufile.shared_window);
  EXPECT_GT(r.cufile.posix, 0u) << "the other request's pieces are in the shared window";
  EXPECT_NE(r.cufile.unjudged.find("could not judge this request alone"), std::string::npos)
      << r.to_text();
  EXPECT_NE(r.to_text().find("strict mode: require=gds could not judge"), std::string::npos);
  EXPECT_TRUE(fb.route().cufile.unjudged.empty()) << "not a strict request";
  // Alone, a strict request whose own pieces went through the compatibility path still fails.
  File alone(posix_path, "r", {false, strict_settings, test::fake_gpu_runtime()});
  EXPECT_THROW(alone.read(b.data(), b.size()), RouteError);
  for (const char* v :
       {"FERRY_FAKE_CUFILE_NVFS", "FERRY_FAKE_CUFILE_POSIX_FILES", "FERRY_FAKE_CUFILE_DELAY_US"}) {
    unsetenv(v);
  }
}

// Issue 11: strict mode judges a request on its own GPU's entry of cuFile's per-GPU counters,
// matched by UUID, so another GPU's requests neither hide its pieces nor make it unjudged.
class CufileStrictPerGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("FERRY_FAKE_CUFILE_NVFS", "1", 1);
    setenv("FERRY_FAKE_CUFILE_POSIX_FILES", "posix-only", 1);  // served through the compat path
    setenv("FERRY_FAKE_CUFILE_GPU1_FILES", "posix-only", 1);   // ...into GPU 1's memory
    setenv("FERRY_FAKE_CUFILE_DELAY_US", "20000", 1);
    test::use_fake_cufile();
    test::FakeMachine::get().set_gpu_uuid(0, "fake-cufile-gpu0");
    test::FakeMachine::get().set_gpu_uuid(1, "fake-cufile-gpu1");
    posix_path_ = f_.path().parent_path() / "posix-only.bin";
    std::filesystem::copy_file(f_.path(), posix_path_,
                               std::filesystem::copy_options::overwrite_existing);
  }
  void TearDown() override {
    for (const char* v : {"FERRY_FAKE_CUFILE_NVFS", "FERRY_FAKE_CUFILE_POSIX_FILES",
                          "FERRY_FAKE_CUFILE_GPU1_FILES", "FERRY_FAKE_CUFILE_DELAY_US"}) {
      unsetenv(v);
    }
    test::FakeMachine::get().set_gpu_uuid(0, std::nullopt);
    test::FakeMachine::get().set_gpu_uuid(1, std::nullopt);
  }
  // Submits a read of `file` as a request into GPU `device`'s memory, from a thread of its own.
  static IoFuture read_on_gpu(File& file, std::vector<unsigned char>& buf, int device) {
    IoFuture out;
    std::thread([&] {
      test::FakeMachine::set_thread_gpu(device);
      out = file.pread(buf.data(), buf.size());
    }).join();
    return out;
  }
  // Strict requests as the test above; the others with compat_mode=off, so they go to cuFile.
  static SettingsOverride one_thread(Require require) {
    SettingsOverride o = require == Require::kAny
                             ? test::with(4 * kMiB)
                             : test::with(4 * kMiB, CompatMode::kAuto, require);
    o.nthreads = 1;
    return o;
  }

  // A strict read of the compatibility-only file into GPU 1, begun while a lenient read of the
  // other file into GPU 0 runs; the lenient one's future is checked, the strict one's returned.
  IoFuture strict_on_gpu1_beside_gpu0() {
    strict_.emplace(posix_path_, "r",
                    FileOptions{false, one_thread(Require::kGds), test::fake_gpu_runtime()});
    other_.emplace(f_.path(), "r",
                   FileOptions{false, one_thread(Require::kAny), test::fake_gpu_runtime()});
    IoFuture other = read_on_gpu(*other_, b_, 0);
    IoFuture strict = read_on_gpu(*strict_, a_, 1);
    EXPECT_EQ(other.get(), b_.size());
    other_route_ = other.route();
    return strict;
  }

  DataFile f_{16 * kMiB};
  std::filesystem::path posix_path_;
  std::optional<File> strict_, other_;
  std::vector<unsigned char> a_ = std::vector<unsigned char>(16 * kMiB);
  std::vector<unsigned char> b_ = std::vector<unsigned char>(16 * kMiB);
  RouteReport other_route_;
};

TEST_F(CufileStrictPerGpu, ARequestOnOneGpuIsJudgedAloneWhileAnotherGpusPiecesGoToTheCompatPath) {
  File strict(f_.path(), "r", {false, one_thread(Require::kGds), test::fake_gpu_runtime()});
  File other(posix_path_, "r", {false, one_thread(Require::kAny), test::fake_gpu_runtime()});
  std::vector<unsigned char> a(16 * kMiB), b(16 * kMiB);
  IoFuture fa = read_on_gpu(strict, a, 0);
  IoFuture fb = read_on_gpu(other, b, 1);  // runs while the strict one does
  EXPECT_EQ(fb.get(), b.size());
  ASSERT_NO_THROW(fa.get());
  EXPECT_EQ(a, f_.data());
  RouteReport r = fa.route();
  EXPECT_EQ(r.cufile.gpu_entry, 0) << r.to_text();
  EXPECT_FALSE(r.cufile.shared_window) << "GPU 1's request is not in GPU 0's entry";
  EXPECT_EQ(r.cufile.nvfs, 4u);
  EXPECT_EQ(r.cufile.posix, 0u) << "GPU 1's pieces are not counted for GPU 0";
  EXPECT_TRUE(r.cufile.unjudged.empty()) << r.cufile.unjudged;
  EXPECT_NE(r.to_text().find("counted on: GPU 0's entry of cuFile's per-GPU counters (by UUID)"),
            std::string::npos)
      << r.to_text();
  RouteReport rb = fb.route();
  EXPECT_EQ(rb.cufile.gpu_entry, 1) << "found by UUID though cuFile lists GPU 1's entry first";
  EXPECT_FALSE(rb.cufile.shared_window);
  EXPECT_EQ(rb.cufile.posix, 4u);
  EXPECT_EQ(rb.cufile.nvfs, 0u);
}

TEST_F(CufileStrictPerGpu, AStrictRequestWhosePiecesWentToTheCompatPathFailsBesideAnotherGpus) {
  // Over the summed counters this request's window was shared with GPU 0's, so it was not
  // judged and passed; on its own GPU's entry its compatibility pieces are its own.
  IoFuture fa = strict_on_gpu1_beside_gpu0();
  try {
    fa.get();
    FAIL() << "a strict request served through the compatibility path passed";
  } catch (const RouteError& e) {
    EXPECT_NE(std::string(e.what()).find("through its POSIX compatibility path"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fa.route().cufile.gpu_entry, 1);
  EXPECT_FALSE(fa.route().cufile.shared_window);
}

TEST_F(CufileStrictPerGpu, AGpuWhoseUuidCuFileDoesNotListIsCountedOverEveryEntryAndSaysSo) {
  test::FakeMachine::get().set_gpu_uuid(1, "not-cufile's-gpu");
  IoFuture fa = strict_on_gpu1_beside_gpu0();
  ASSERT_NO_THROW(fa.get()) << "over the summed counters the window was shared: not judged";
  RouteReport r = fa.route();
  EXPECT_EQ(r.cufile.gpu_entry, -1);
  EXPECT_TRUE(r.cufile.shared_window);
  EXPECT_NE(r.cufile.counted_over.find("none of cuFile's 2 per-GPU entries has GPU 1's UUID"),
            std::string::npos)
      << r.cufile.counted_over;
  EXPECT_NE(r.cufile.unjudged.find("every GPU's, summed"), std::string::npos) << r.cufile.unjudged;
  // GPU 0's request is still counted on its own entry, which no other request shared: GPU 1's
  // pieces went to an entry of another UUID.
  EXPECT_EQ(other_route_.cufile.gpu_entry, 0);
  EXPECT_FALSE(other_route_.cufile.shared_window);
  EXPECT_EQ(other_route_.cufile.nvfs, 4u);
}

TEST_F(CufileStrictPerGpu, ARequestOnAGpuOfUnknownUuidSharesTheWindowOfEveryGpu) {
  test::FakeMachine::get().set_gpu_uuid(1,
                                        std::nullopt);  // no driver here: GPU 1's UUID is not known
  File named(f_.path(), "r", {false, one_thread(Require::kAny), test::fake_gpu_runtime()});
  File unnamed(posix_path_, "r", {false, one_thread(Require::kAny), test::fake_gpu_runtime()});
  std::vector<unsigned char> a(16 * kMiB), b(16 * kMiB);
  IoFuture fa = read_on_gpu(named, a, 0);
  IoFuture fb = read_on_gpu(unnamed, b, 1);
  EXPECT_EQ(fa.get(), a.size());
  EXPECT_EQ(fb.get(), b.size());
  RouteReport rb = fb.route();
  EXPECT_EQ(rb.cufile.gpu_entry, -1);
  EXPECT_TRUE(rb.cufile.shared_window);
  EXPECT_NE(rb.cufile.counted_over.find("GPU 1's UUID is not known"), std::string::npos)
      << rb.cufile.counted_over;
  // Its pieces may be in any entry, GPU 0's too: GPU 0's window is shared.
  RouteReport ra = fa.route();
  EXPECT_EQ(ra.cufile.gpu_entry, 0);
  EXPECT_TRUE(ra.cufile.shared_window);
}

TEST(CufileStrict, RequireCufileRefusesLayer1FallbackOnly) {
  test::use_fake_cufile();
  DataFile f(8 * kMiB);
  std::vector<unsigned char> buf(8 * kMiB);
  File ok(
      f.path(), "r",
      {false, test::with(4 * kMiB, CompatMode::kAuto, Require::kCufile), test::fake_gpu_runtime()});
  ASSERT_EQ(ok.read(buf.data(), buf.size()), buf.size());
  EXPECT_EQ(ok.last_route().cufile.posix, 2u) << "cuFile's compatibility path is allowed";

  setenv("FERRY_FAKE_CUFILE_HANDLE_ERROR", "5027", 1);
  File refused(
      f.path(), "r",
      {false, test::with(4 * kMiB, CompatMode::kAuto, Require::kCufile), test::fake_gpu_runtime()});
  EXPECT_THROW(refused.read(buf.data(), buf.size()), RouteError);
  std::vector<unsigned char> small(8192);
  try {
    ok.read(small.data(), small.size());
    FAIL() << "expected RouteError";
  } catch (const RouteError& e) {
    EXPECT_NE(std::string(e.what()).find("below gds_threshold"), std::string::npos) << e.what();
  }
  unsetenv("FERRY_FAKE_CUFILE_HANDLE_ERROR");
}

}  // namespace
}  // namespace ferry
