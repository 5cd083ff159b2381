// ferry's remote sources against the test HTTP server (tests/remote/http_server.h) on 127.0.0.1:
// exact bytes through every ferry entry point in C++, the faults of issue 34 met as
// docs/remote.md says, S3 signing and anonymous access, and no credential or presigned
// signature in any message or report.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ferry/checkpoint.h"
#include "ferry/checkpoint_writer.h"
#include "ferry/error.h"
#include "ferry/file.h"
#include "ferry/remote.h"
#include "ferry/runtime.h"
#include "ferry/settings.h"
#include "served_folder.h"
#include "test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using test::HttpServer;
using test::ScopedEnv;

std::vector<char> random_bytes(std::size_t n, unsigned seed) {
  std::vector<char> v(n);
  std::mt19937 r(seed);
  for (char& c : v) c = static_cast<char>(r());
  return v;
}

class RemoteSource : public test::ServedFolder {
 protected:
  std::vector<char> put(const std::string& name, std::size_t size, unsigned seed = 1) {
    std::vector<char> data = random_bytes(size, seed);
    fs::create_directories((root_ / name).parent_path());
    std::ofstream(root_ / name, std::ios::binary).write(data.data(), static_cast<long>(size));
    return data;
  }
  std::string url(const std::string& name) const { return server_->url(name); }
  std::size_t gets() const {
    std::size_t n = 0;
    for (const std::string& line : server_->request_lines()) n += line.rfind("GET ", 0) == 0;
    return n;
  }

  // GETs a read of r.bin (opened now: the retry policy is read at open) makes while every
  // answer is `status`, until it fails.
  std::size_t gets_until_it_fails(int status) {
    File f(url("r.bin"), "r");
    const std::size_t before = gets();
    server_->fail_next(100, status, "<Error><Code>X</Code><Message>y</Message></Error>");
    std::vector<char> got(5000);
    EXPECT_THROW(f.read(got.data(), got.size(), 0), IoError);
    server_->fail_next(0, 200, "");
    return gets() - before;
  }

  ScopedEnv fast_retries_{"FERRY_REMOTE_RETRIES", "3"};
};

TEST_F(RemoteSource, ReadsExactBytesOfEverySize) {
  for (std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{12345},
                           (std::size_t{9} << 20) + 77}) {
    const std::string name = "obj-" + std::to_string(size);
    const std::vector<char> data = put(name, size, static_cast<unsigned>(size));
    File f(url(name), "r");
    ASSERT_EQ(f.size(), size);
    std::vector<char> got(size + 10, 'x');
    EXPECT_EQ(f.read(got.data(), got.size(), 0), size) << name;
    EXPECT_TRUE(std::equal(data.begin(), data.end(), got.begin())) << name;
    if (size > 2) {
      std::vector<char> mid(size - 2);
      EXPECT_EQ(f.pread(mid.data(), mid.size(), 1).get(), size - 2);
      EXPECT_TRUE(std::equal(mid.begin(), mid.end(), data.begin() + 1));
    }
  }
}

TEST_F(RemoteSource, ReportsTheSourceLayerAndTheRule) {
  const std::vector<char> data = put("big.bin", std::size_t{10} << 20);
  File f(url("big.bin"), "r");
  std::vector<char> got(data.size());
  IoFuture fut = f.pread(got.data(), got.size(), 0);
  EXPECT_EQ(fut.get(), data.size());
  RouteReport r = fut.route();
  ASSERT_FALSE(r.reasons.empty());
  EXPECT_EQ(r.reasons.front().code, ReasonCode::kRemoteSource);
  EXPECT_TRUE(r.source.remote);
  EXPECT_EQ(r.source.url, url("big.bin"));
  EXPECT_EQ(r.source.gets, r.tasks);
  EXPECT_EQ(r.source.bytes, data.size());
  EXPECT_EQ(r.source.retries, 0u);
  EXPECT_NE(r.to_text().find("ranged GET"), std::string::npos);
  EXPECT_NE(r.to_json().find("\"source\""), std::string::npos);
  EXPECT_FALSE(r.page_cache.known);
}

TEST_F(RemoteSource, GathersRangesIntoSeveralBuffers) {
  const std::vector<char> data = put("g.bin", 300000);
  File f(url("g.bin"), "r");
  std::vector<char> a(1000), b(70000), c(1);
  std::vector<ReadRange> ranges = {
      {5, a.size(), a.data()}, {200000, b.size(), b.data()}, {299999, c.size(), c.data()}};
  EXPECT_EQ(f.pread_gather(ranges).get(), a.size() + b.size() + c.size());
  EXPECT_EQ(std::memcmp(a.data(), data.data() + 5, a.size()), 0);
  EXPECT_EQ(std::memcmp(b.data(), data.data() + 200000, b.size()), 0);
  EXPECT_EQ(c[0], data[299999]);
}

TEST_F(RemoteSource, RetriesSlowDownAndServerErrorsThenSucceeds) {
  const std::vector<char> data = put("r.bin", 5000);
  File f(url("r.bin"), "r");
  server_->fail_next(2, 503,
                     "<?xml version=\"1.0\"?><Error><Code>SlowDown</Code><Message>Please reduce "
                     "your request rate.</Message></Error>");
  std::vector<char> got(data.size());
  IoFuture fut = f.pread(got.data(), got.size(), 0);
  EXPECT_EQ(fut.get(), data.size());
  EXPECT_EQ(got, data);
  const RouteReport r = fut.route();
  EXPECT_EQ(r.source.retries, 2u);
  EXPECT_NE(r.source.retried.find("HTTP 503 x2"), std::string::npos) << r.source.retried;
  EXPECT_EQ(gets(), 3u);
}

TEST_F(RemoteSource, GivesUpAfterTheRetriesWithTheServersWords) {
  put("r.bin", 5000);
  File f(url("r.bin"), "r");
  server_->fail_next(100, 500,
                     "<Error><Code>InternalError</Code><Message>We encountered an internal "
                     "error.</Message></Error>");
  std::vector<char> got(5000);
  try {
    f.read(got.data(), got.size(), 0);
    FAIL() << "no error";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("HTTP 500: InternalError: We encountered an internal error."),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("after 4 attempts"), std::string::npos) << m;
    EXPECT_NE(m.find(url("r.bin")), std::string::npos) << m;
  }
  EXPECT_EQ(gets(), 4u);  // FERRY_REMOTE_RETRIES=3
}

// The process's policy (what ferry.kvikio's http_* settings set) over the variables; KvikIO's
// variables where ferry's are unset. Each case opens a fresh File: the policy is read at open.
class PolicyReset {
 public:
  ~PolicyReset() { set_remote_policy(RemotePolicy{}); }
};

RemotePolicy policy(std::optional<int> retries, std::optional<long> stall_seconds,
                    std::optional<std::vector<int>> statuses) {
  RemotePolicy p;
  p.retries = retries;
  p.stall_seconds = stall_seconds;
  p.retry_statuses = std::move(statuses);
  return p;
}

TEST_F(RemoteSource, ThePolicySetInTheProcessOverridesTheVariables) {
  PolicyReset reset;
  put("r.bin", 5000);
  EXPECT_EQ(gets_until_it_fails(500), 4u);  // FERRY_REMOTE_RETRIES=3 (the fixture's)
  set_remote_policy(policy(1, {}, {}));
  EXPECT_EQ(gets_until_it_fails(500), 2u);
  EXPECT_EQ(remote_policy().retries, 1);
  set_remote_policy(policy(2, {}, std::vector<int>{500}));
  EXPECT_EQ(gets_until_it_fails(500), 3u);
  EXPECT_EQ(gets_until_it_fails(503), 1u) << "503 is not among the statuses retried";
  set_remote_policy(RemotePolicy{});
  EXPECT_EQ(gets_until_it_fails(503), 4u);
  EXPECT_THROW(set_remote_policy(policy(101, {}, {})), SettingError);
  EXPECT_THROW(set_remote_policy(policy({}, 0, {})), SettingError);
  EXPECT_THROW(set_remote_policy(policy({}, {}, std::vector<int>{42})), SettingError);
  EXPECT_FALSE(remote_policy().retries.has_value()) << "a refused policy changes nothing";
}

TEST_F(RemoteSource, KvikiosVariablesCountWhereFerrysAreUnset) {
  put("r.bin", 5000);
  ScopedEnv no_ferry("FERRY_REMOTE_RETRIES", nullptr);
  ScopedEnv attempts("KVIKIO_HTTP_MAX_ATTEMPTS", "2");
  ScopedEnv codes("KVIKIO_HTTP_STATUS_CODES", "429, 500");
  EXPECT_EQ(gets_until_it_fails(500), 2u) << "KVIKIO_HTTP_MAX_ATTEMPTS counts the first GET";
  EXPECT_EQ(gets_until_it_fails(503), 1u) << "KVIKIO_HTTP_STATUS_CODES names those retried";
  {
    ScopedEnv ferry_wins("FERRY_REMOTE_RETRIES", "0");
    EXPECT_EQ(gets_until_it_fails(500), 1u);
  }
  ScopedEnv bad("KVIKIO_HTTP_STATUS_CODES", "500,abc");
  try {
    File f(url("r.bin"), "r");
    FAIL() << "a bad KVIKIO_HTTP_STATUS_CODES was accepted";
  } catch (const SettingError& e) {
    EXPECT_NE(std::string(e.what()).find("invalid KVIKIO_HTTP_STATUS_CODES='500,abc'"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(RemoteSource, NeverRetriesNotFoundOrForbidden) {
  try {
    File f(url("missing.bin"), "r");
    FAIL() << "opened a missing object";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), ENOENT);
    EXPECT_NE(std::string(e.what()).find("HTTP 404: NoSuchKey"), std::string::npos) << e.what();
  }
  put("f.bin", 100);
  File f(url("f.bin"), "r");
  server_->fail_next(1, 403,
                     "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>");
  std::vector<char> got(100);
  const std::size_t before = gets();
  try {
    f.read(got.data(), got.size(), 0);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EACCES);
    EXPECT_NE(std::string(e.what()).find("HTTP 403: AccessDenied: Access Denied"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(gets(), before + 1);
}

TEST_F(RemoteSource, RetriesResetsShortBodiesAndStalls) {
  ScopedEnv timeout("FERRY_REMOTE_TIMEOUT", "1");
  const std::vector<char> data = put("s.bin", 200000);
  File f(url("s.bin"), "r");
  std::vector<char> got(data.size());
  server_->abort_next(2);  // libcurl resends once by itself on a kept-alive connection
  EXPECT_EQ(f.read(got.data(), got.size(), 0), data.size());
  EXPECT_EQ(got, data);
  std::fill(got.begin(), got.end(), 0);
  server_->short_body_next(1);
  IoFuture fut = f.pread(got.data(), got.size(), 0);
  EXPECT_EQ(fut.get(), data.size());
  EXPECT_EQ(got, data);
  EXPECT_EQ(fut.route().source.retries, 1u);
  std::fill(got.begin(), got.end(), 0);
  server_->stall_next(1, std::chrono::milliseconds(3000));
  fut = f.pread(got.data(), got.size(), 0);
  EXPECT_EQ(fut.get(), data.size());
  EXPECT_EQ(got, data);
  EXPECT_EQ(fut.route().source.retries, 1u);
  EXPECT_NE(fut.route().source.retried.find("Timeout"), std::string::npos)
      << fut.route().source.retried;
}

TEST_F(RemoteSource, RefusesAnAnswerThatIsNotTheRangeBeforeAByteLands) {
  put("w.bin", 100000);
  File f(url("w.bin"), "r");
  server_->wrong_range_next(1);
  std::vector<char> got(1000, 'x');
  try {
    f.read(got.data(), got.size(), 500);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("answered bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::count(got.begin(), got.end(), 'x'), 1000) << "bytes landed";
}

TEST_F(RemoteSource, AnObjectChangedDuringTheReadIsAnError) {
  put("e.bin", 100000);
  File f(url("e.bin"), "r");
  server_->set_etag_suffix("-v2");
  std::vector<char> got(1000);
  try {
    f.read(got.data(), got.size(), 0);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), ESTALE);
    EXPECT_NE(std::string(e.what()).find("changed since it was opened"), std::string::npos)
        << e.what();
  }
}

TEST_F(RemoteSource, IsReadOnlyAndRefusesStrictModesBeforeIo) {
  put("ro.bin", 100);
  try {
    File f(url("ro.bin"), "w");
    FAIL() << "opened for writing";
  } catch (const IoError& e) {
    EXPECT_EQ(e.error_code(), EROFS);
  }
  FileOptions strict;
  strict.settings.require = Require::kCufile;
  File f(url("ro.bin"), "r", strict);
  std::vector<char> got(100);
  const std::size_t before = gets();
  EXPECT_THROW(f.read(got.data(), got.size(), 0), RouteError);
  EXPECT_EQ(gets(), before);
}

TEST_F(RemoteSource, APresignedQueryNeverAppearsInMessagesOrReports) {
  put("p.bin", 100);
  const std::string signed_url =
      url("p.bin") + "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=deadbeefsecret";
  File f(signed_url, "r");
  EXPECT_EQ(f.path().find("deadbeef"), std::string::npos) << f.path();
  std::vector<char> got(100);
  IoFuture fut = f.pread(got.data(), got.size(), 0);
  fut.get();
  EXPECT_EQ(fut.route().to_json().find("deadbeef"), std::string::npos);
  // The query went to the server: a presigned URL signs the GET itself.
  EXPECT_NE(server_->request_lines().back().find("GET /p.bin"), std::string::npos);
  server_->fail_next(1, 403, "<Error><Code>SignatureDoesNotMatch</Code></Error>");
  try {
    f.read(got.data(), got.size(), 0);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()).find("deadbeef"), std::string::npos) << e.what();
  }
}

TEST_F(RemoteSource, SignsS3RequestsWithSigV4AndNeverShowsTheSecret) {
  put("bucket/dir/key one.bin", 4000);
  ScopedEnv endpoint("AWS_ENDPOINT_URL", server_->url("").c_str());
  ScopedEnv region("AWS_REGION", "eu-west-3");
  ScopedEnv id("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE");
  ScopedEnv secret("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
  ScopedEnv token("AWS_SESSION_TOKEN", "the-session-token");
  File f("s3://bucket/dir/key one.bin", "r");
  std::vector<char> got(4000);
  IoFuture fut = f.pread(got.data(), got.size(), 0);
  EXPECT_EQ(fut.get(), 4000u);
  const auto headers = server_->request_headers().back();
  ASSERT_TRUE(headers.contains("authorization"));
  EXPECT_EQ(headers.at("authorization").rfind("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/", 0), 0u)
      << headers.at("authorization");
  EXPECT_NE(headers.at("authorization").find("/eu-west-3/s3/aws4_request"), std::string::npos);
  EXPECT_TRUE(headers.contains("x-amz-date"));
  EXPECT_TRUE(headers.contains("x-amz-content-sha256"));
  EXPECT_EQ(headers.at("x-amz-security-token"), "the-session-token");
  EXPECT_NE(server_->request_lines().back().find("/bucket/dir/key%20one.bin"), std::string::npos)
      << server_->request_lines().back();
  const RouteReport r = fut.route();
  EXPECT_NE(r.source.auth.find("SigV4"), std::string::npos);
  for (const std::string& text : {r.to_text(), r.to_json(), f.path()}) {
    EXPECT_EQ(text.find("wJalrXUtnFEMI"), std::string::npos) << text;
    EXPECT_EQ(text.find("the-session-token"), std::string::npos) << text;
  }
  for (const auto& h : server_->request_headers()) {
    for (const auto& [name, value] : h) {
      EXPECT_EQ(value.find("wJalrXUtnFEMI"), std::string::npos) << name;
    }
  }
}

TEST_F(RemoteSource, ReadsPublicBucketsAnonymously) {
  put("pub/k.bin", 10);
  ScopedEnv endpoint("AWS_ENDPOINT_URL", server_->url("").c_str());
  ScopedEnv id("AWS_ACCESS_KEY_ID", nullptr);
  ScopedEnv secret("AWS_SECRET_ACCESS_KEY", nullptr);
  File f("s3://pub/k.bin", "r");
  std::vector<char> got(10);
  IoFuture fut = f.pread(got.data(), got.size(), 0);
  EXPECT_EQ(fut.get(), 10u);
  EXPECT_FALSE(server_->request_headers().back().contains("authorization"));
  EXPECT_NE(fut.route().source.auth.find("anonymous"), std::string::npos);
}

TEST_F(RemoteSource, HalfSetCredentialsAreAnErrorNamingTheVariable) {
  ScopedEnv endpoint("AWS_ENDPOINT_URL", server_->url("").c_str());
  ScopedEnv id("AWS_ACCESS_KEY_ID", "AKID");
  ScopedEnv secret("AWS_SECRET_ACCESS_KEY", nullptr);
  try {
    File f("s3://b/k", "r");
    FAIL() << "opened";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("AWS_SECRET_ACCESS_KEY is not"), std::string::npos)
        << e.what();
  }
}

TEST_F(RemoteSource, LoadsACheckpointByIndexPrefixAndFile) {
  // Two shards and an index, written by ferry's own writer into the served folder.
  std::vector<float> w(1 << 16), b(1000);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);
  std::vector<std::int64_t> ids = {7, 8, 9};
  std::vector<TensorSource> tensors = {{"w", Dtype::kF32, {256, 256}, w.data(), w.size() * 4},
                                       {"b", Dtype::kF32, {1000}, b.data(), b.size() * 4},
                                       {"ids", Dtype::kI64, {3}, ids.data(), ids.size() * 8}};
  SaveOptions options;
  options.max_shard_size = 200000;
  save_checkpoint(tensors, root_ / "model", options);
  for (const std::string& where :
       {url("model/"), url("model"), url("model/model.safetensors.index.json")}) {
    Checkpoint remote(where);
    Checkpoint local(root_ / "model");
    ASSERT_EQ(remote.tensors().size(), 3u) << where;
    LoadOptions host;
    host.memory = MemoryKind::kHostPageable;
    LoadResult got = remote.load(host);
    LoadResult want = local.load(host);
    ASSERT_EQ(got.tensors.size(), want.tensors.size());
    for (std::size_t i = 0; i < got.tensors.size(); ++i) {
      ASSERT_EQ(got.tensors[i].nbytes, want.tensors[i].nbytes);
      EXPECT_EQ(std::memcmp(got.tensors[i].data, want.tensors[i].data, got.tensors[i].nbytes), 0)
          << got.tensors[i].name;
    }
    EXPECT_TRUE(got.report.routes.front().source.remote);
  }
  try {
    Checkpoint missing(url("nothing-here/"));
    FAIL() << "loaded nothing";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("neither model.safetensors.index.json"), std::string::npos)
        << e.what();
  }
}

TEST_F(RemoteSource, AnIndexCannotNameAShardElsewhere) {
  fs::create_directories(root_ / "evil");
  std::ofstream(root_ / "evil" / "model.safetensors.index.json")
      << R"({"weight_map": {"w": "../other/model.safetensors"}})";
  EXPECT_THROW(Checkpoint(url("evil/")), CheckpointError);
  std::ofstream(root_ / "evil" / "model.safetensors.index.json")
      << R"({"weight_map": {"w": "http://elsewhere/x.safetensors"}})";
  EXPECT_THROW(Checkpoint(url("evil/")), CheckpointError);
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

TEST_F(RemoteSource, ConnectionsAreKeptAliveAcrossRequests) {
  // GETs land straight in the buffer over connections ferry's workers keep (http_get.cc): a
  // second read of the object opens none. One worker, so that the same thread serves both: a
  // runtime of its own, since the process's has as many threads as earlier tests grew, any of
  // which may take the second read's tasks. Plain and signed alike: signed requests are signed
  // by ferry and take the same path (they took libcurl's transfer, whose HEAD left no connection
  // for the worker: two in all).
  const std::vector<char> data = put("bucket/k.bin", std::size_t{20} << 20);
  ScopedEnv endpoint("AWS_ENDPOINT_URL", server_->url("").c_str());
  ScopedEnv id("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE");
  ScopedEnv secret("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
  for (const std::string& where : {url("bucket/k.bin"), std::string("s3://bucket/k.bin")}) {
    Runtime runtime;
    FileOptions one_worker;
    one_worker.runtime = &runtime;
    one_worker.settings.host_nthreads = 1;
    const std::size_t connections = server_->connections();
    File f(where, "r", one_worker);
    std::vector<char> got(data.size());
    IoFuture first = f.pread(got.data(), got.size(), 0);
    ASSERT_EQ(first.get(), data.size()) << where;
    // The worker took the connection the open's HEAD left (issue 48): one in all.
    EXPECT_EQ(first.route().source.connections, 0u) << where;
    EXPECT_EQ(server_->connections(), connections + 1) << where;
    std::fill(got.begin(), got.end(), 0);
    IoFuture second = f.pread(got.data(), got.size(), 0);
    ASSERT_EQ(second.get(), data.size()) << where;
    EXPECT_EQ(got, data) << where;
    EXPECT_EQ(second.route().source.connections, 0u) << where;
    EXPECT_EQ(server_->connections(), connections + 1) << where;
    EXPECT_EQ(second.route().source.gets, second.route().tasks) << where;
  }
}

}  // namespace
}  // namespace ferry

// Issue 45 part B: what servers say is checked before it is believed or sent back.
namespace ferry {
namespace {

TEST_F(RemoteSource, AWholeObjectAnswerIgnoringRangeAndIfMatchHasItsETagChecked) {
  // Issue 45 B11: a 200 whole-object answer to a range over the whole object was taken
  // without comparing its ETag with the one seen at open.
  const std::vector<char> data = put("w.bin", 1000);
  File f(url("w.bin"), "r");
  server_->set_etag_suffix("-v2");
  server_->ignore_range_next(1);
  server_->ignore_if_match_next(1);
  std::vector<char> got(data.size(), 'x');
  try {
    f.read(got.data(), got.size(), 0);
    FAIL() << "read a replaced object";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("changed during the read"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(url("w.bin")), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::count(got.begin(), got.end(), 'x'), 1000) << "bytes landed";
}

TEST_F(RemoteSource, AWeakETagIsNotSentInIfMatchButEachAnswersETagIsCompared) {
  // Issue 45 B8: If-Match compares strongly, so an RFC-strict server answers 412 to every GET
  // that carries a weak ETag.
  const std::vector<char> data = put("weak.bin", 300000);
  server_->set_weak_etags(true);
  File f(url("weak.bin"), "r");
  std::vector<char> got(data.size());
  EXPECT_EQ(f.read(got.data(), got.size(), 0), data.size());
  EXPECT_EQ(got, data);
  for (const auto& h : server_->request_headers()) EXPECT_FALSE(h.contains("if-match"));
  server_->set_etag_suffix("-v2");
  try {
    f.read(got.data(), got.size(), 0);
    FAIL() << "read a replaced object";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("changed during the read"), std::string::npos) << e.what();
  }
}

TEST_F(RemoteSource, AnETagWithAControlCharacterIsRefusedNotSentBack) {
  // Issue 45 B12: a bare CR in a server's ETag went into later requests' If-Match.
  put("cr.bin", 1000);
  server_->set_etag_suffix("\rX-Injected: 1");
  try {
    File f(url("cr.bin"), "r");
    std::vector<char> got(1000);
    f.read(got.data(), got.size(), 0);
    FAIL() << "opened and read with an ETag holding a CR";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("control character"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(url("cr.bin")), std::string::npos) << e.what();
  }
  for (const auto& h : server_->request_headers()) {
    for (const auto& [name, value] : h) {
      EXPECT_EQ(value.find('\r'), std::string::npos) << name;
      EXPECT_NE(name, "x-injected");
    }
  }
}

TEST_F(RemoteSource, AHeadWithoutContentLengthLearnsTheSizeFromARangedGet) {
  // Issue 45 B1: a HEAD answer without Content-Length was taken for an empty object: a 0-byte
  // read that succeeded.
  const std::vector<char> data = put("nolen.bin", 5000);
  server_->set_head_without_length(true);
  File f(url("nolen.bin"), "r");
  EXPECT_EQ(f.size(), data.size());
  std::vector<char> got(data.size());
  EXPECT_EQ(f.read(got.data(), got.size(), 0), data.size());
  EXPECT_EQ(got, data);
  const std::vector<std::string> lines = server_->request_lines();
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[1], "GET /nolen.bin bytes=0-0");
}

TEST_F(RemoteSource, TheOpenErrorSaysTheAttemptsAndTheirTimeAndSendsNoMore) {
  // Issue 45 B15: a HEAD that failed was followed by one more GET beyond the retries, whose
  // error hid the count (and libcurl's "after 0 ms" read as the time of them all) or which
  // succeeded on a status the policy said not to retry.
  PolicyReset reset;
  put("h.bin", 100);
  server_->fault_head_requests(true);
  server_->fail_next(100, 500);
  try {
    File f(url("h.bin"), "r");
    FAIL() << "opened";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("HTTP 500 (after 4 attempts in "), std::string::npos) << m;
    EXPECT_NE(m.find(url("h.bin")), std::string::npos) << m;
    EXPECT_NE(m.find("FERRY_REMOTE_RETRIES"), std::string::npos) << m;
  }
  EXPECT_EQ(server_->requests(), 4u) << "FERRY_REMOTE_RETRIES=3: four requests in all";

  set_remote_policy(policy({}, {}, std::vector<int>{500}));
  const std::size_t before = server_->requests();
  server_->fail_next(1, 503);
  EXPECT_THROW(File(url("h.bin"), "r"), IoError) << "503 is not retried: no GET may follow";
  EXPECT_EQ(server_->requests(), before + 1);

  // Nothing listens on a port just closed: every attempt is refused at once.
  std::string refused;
  {
    HttpServer gone(root_);
    refused = gone.url("h.bin");
  }
  set_remote_policy(RemotePolicy{});
  try {
    File f(refused, "r");
    FAIL() << "opened";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("(after 4 attempts in "), std::string::npos) << m;
    EXPECT_EQ(m.find(" ms"), std::string::npos) << m;
  }
}

TEST_F(RemoteSource, ADeadlineBoundsAWholeRequestThatKeepsTrickling) {
  // Issue 45 B5: a GET whose bytes keep coming, one a tenth of a second, was never cut: only a
  // stall (no byte at all) was. KvikIO's http_timeout, and ferry's deadline, bound it in all.
  put("t.bin", 100);
  put("bucket/t.bin", 100);
  ScopedEnv no_retries("FERRY_REMOTE_RETRIES", "0");
  ScopedEnv endpoint("AWS_ENDPOINT_URL", server_->url("").c_str());
  ScopedEnv id("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE");
  ScopedEnv secret("AWS_SECRET_ACCESS_KEY", "secret");
  // Plain HTTP (received straight into place) and signed S3 (libcurl's transfer).
  for (const std::string& where : {url("t.bin"), std::string("s3://bucket/t.bin")}) {
    for (const char* name : {"KVIKIO_HTTP_TIMEOUT", "FERRY_REMOTE_DEADLINE"}) {
      ScopedEnv deadline(name, "1");
      File f(where, "r");
      server_->trickle_next(1, std::chrono::milliseconds(100));  // 100 B in 10 s
      std::vector<char> got(100);
      const auto start = std::chrono::steady_clock::now();
      try {
        f.read(got.data(), got.size(), 0);
        FAIL() << where << " " << name << ": read in full";
      } catch (const IoError& e) {
        EXPECT_NE(std::string(e.what()).find("deadline of 1 s"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("FERRY_REMOTE_DEADLINE"), std::string::npos)
            << e.what();
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3)) << where;
      server_->clear_faults();
    }
  }
  EXPECT_EQ(effective_remote_policy().request_seconds, 0) << "no deadline unless one is set";
}

TEST_F(RemoteSource, ASignedRequestIsNotRedirectedOffItsHostWithItsCredentials) {
  // Issue 45 B2: libcurl followed a signed request's redirect to another host (or from https to
  // http) and sent its x-amz-security-token there.
  put("bucket/k.bin", 4000);
  HttpServer elsewhere(root_);
  ScopedEnv endpoint("AWS_ENDPOINT_URL", server_->url("").c_str());
  ScopedEnv id("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE");
  ScopedEnv secret("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY");
  ScopedEnv token("AWS_SESSION_TOKEN", "the-session-token");
  const std::string other = "http://127.0.0.1:" + std::to_string(elsewhere.port());
  server_->fault_head_requests(true);
  server_->redirect_next(1, other);
  try {
    File f("s3://bucket/k.bin", "r");
    FAIL() << "followed the redirect";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("redirected a signed request to " + other + "/bucket/k.bin"),
              std::string::npos)
        << m;
    EXPECT_EQ(m.find("the-session-token"), std::string::npos) << m;
  }
  EXPECT_EQ(elsewhere.requests(), 0u) << "a request went to the other host";
  // On its own host a redirect is followed, signed again for where it leads.
  const std::string self = "http://127.0.0.1:" + std::to_string(server_->port());
  server_->redirect_next(1, self);
  File f("s3://bucket/k.bin", "r");
  server_->redirect_next(1, self);
  std::vector<char> got(4000);
  EXPECT_EQ(f.read(got.data(), got.size(), 0), got.size());
  const auto headers = server_->request_headers();
  EXPECT_EQ(headers.back().at("x-amz-security-token"), "the-session-token");
  EXPECT_TRUE(headers.back().contains("authorization"));
}

TEST_F(RemoteSource, CancellingStopsAnOpenOrAReadAtOnce) {
  // Issue 45 B4: a cancelled request waited for its GETs in flight (libcurl looks at its
  // progress callback about once a second) and for their retry waits (a Retry-After of 20 s).
  put("bucket/c.bin", 1000);
  ScopedEnv endpoint("AWS_ENDPOINT_URL", server_->url("").c_str());
  ScopedEnv id("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE");  // signed: libcurl's own transfers
  ScopedEnv secret("AWS_SECRET_ACCESS_KEY", "secret");
  ScopedEnv patient("FERRY_REMOTE_TIMEOUT", "600");
  const auto quickly = std::chrono::milliseconds(300);
  File f("s3://bucket/c.bin", "r");
  server_->stall_next(1, std::chrono::seconds(30));
  std::vector<char> got(1000);
  IoFuture read = f.pread(got.data(), got.size(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(read.cancel());
  EXPECT_THROW(read.get(), IoError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, quickly) << "the GET in flight went on";

  for (const bool retry_wait : {false, true}) {
    server_->fault_head_requests(true);
    if (retry_wait) {
      server_->fail_next(100, 503, "", "20");
    } else {
      server_->stall_next(1, std::chrono::seconds(30));
    }
    std::atomic<bool> cancel{false};
    FileOptions options;
    options.cancel = &cancel;
    std::thread stopper([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      start = std::chrono::steady_clock::now();
      cancel = true;
    });
    try {
      File g("s3://bucket/c.bin", "r", options);
      ADD_FAILURE() << "opened";
    } catch (const IoError& e) {
      EXPECT_EQ(e.error_code(), ECANCELED) << e.what();
      EXPECT_NE(std::string(e.what()).find("/bucket/c.bin: cancelled"), std::string::npos)
          << e.what();
    }
    stopper.join();
    EXPECT_LT(std::chrono::steady_clock::now() - start, quickly) << "retry wait: " << retry_wait;
    server_->clear_faults();
  }
}

}  // namespace
}  // namespace ferry

// Issue 47: the first server anyone tries (python3 -m http.server) ignores Range, and ferry
// refused its 200 answers; they are read as curl reads them, cut to the range asked for.
namespace ferry {
namespace {

// The GETs the server saw after the first `from` requests.
std::vector<std::string> gets_since(const HttpServer& server, std::size_t from) {
  std::vector<std::string> out;
  const std::vector<std::string> lines = server.request_lines();
  for (std::size_t i = from; i < lines.size(); ++i) {
    if (lines[i].rfind("GET ", 0) == 0) out.push_back(lines[i]);
  }
  return out;
}

TEST_F(RemoteSource, AWholeObjectAnswerToARangeMidFileGivesTheRangeAndTheReadsAfterStream) {
  // The server says Accept-Ranges: bytes, yet answers one GET with the whole object.
  const std::vector<char> data = put("mid.bin", std::size_t{10} << 20);
  File f(url("mid.bin"), "r");
  server_->ignore_range_next(1);
  std::vector<char> got(1000, 'x');
  IoFuture fut = f.pread(got.data(), got.size(), 500);
  ASSERT_EQ(fut.get(), 1000u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin() + 500));
  EXPECT_TRUE(fut.route().source.range_ignored);
  EXPECT_EQ(fut.route().source.discarded, 500u);
  EXPECT_NE(fut.route().to_text().find("the server ignores Range"), std::string::npos)
      << fut.route().to_text();
  // From then on the object is read in order on one worker, from one GET, as the report says.
  const std::size_t before = server_->request_lines().size();
  std::vector<char> all(data.size());
  IoFuture whole = f.pread(all.data(), all.size(), 0);
  ASSERT_EQ(whole.get(), data.size());
  EXPECT_EQ(all, data);
  EXPECT_EQ(gets_since(*server_, before).size(), 1u);
  EXPECT_EQ(whole.route().workers, 1u);
  EXPECT_EQ(whole.route().source.gets, 1u);
  std::string engine;
  for (const RouteReason& r : whole.route().reasons) {
    if (r.code == ReasonCode::kEngine) engine = r.text;
  }
  EXPECT_NE(engine.find("one worker"), std::string::npos) << engine;
  EXPECT_NE(engine.find("bytes 500-1499 with the whole object"), std::string::npos) << engine;
}

TEST_F(RemoteSource, AServerThatIgnoresRangeCostsOneGetPerRead) {
  // As python3 -m http.server: 200 to every GET, no Accept-Ranges, no ETag. The open cannot
  // tell (it sends a HEAD only), so the first read runs in order on one worker too, and its GET
  // tells: never a whole-object GET per task.
  server_->set_ignore_ranges(true);
  server_->set_without_etags(true);
  const std::vector<char> data = put("s.bin", (std::size_t{9} << 20) + 77);
  File f(url("s.bin"), "r");
  ASSERT_EQ(f.size(), data.size());
  std::size_t before = server_->request_lines().size();
  std::vector<char> got(data.size(), 'x');
  IoFuture whole = f.pread(got.data(), got.size(), 0);
  ASSERT_EQ(whole.get(), data.size());
  EXPECT_EQ(got, data);
  EXPECT_EQ(gets_since(*server_, before),
            std::vector<std::string>{"GET /s.bin bytes=0-" + std::to_string(data.size() - 1)});
  const RouteReport& r = whole.route();
  EXPECT_GT(r.tasks, 1u);
  EXPECT_EQ(r.workers, 1u);
  EXPECT_TRUE(r.source.range_ignored);
  EXPECT_EQ(r.source.gets, 1u);
  EXPECT_EQ(r.source.bytes, data.size());
  EXPECT_EQ(r.source.discarded, 0u);
  EXPECT_NE(r.to_text().find("streamed in order from 1 GET(s) of the whole object"),
            std::string::npos)
      << r.to_text();
  EXPECT_NE(r.to_json().find("\"range_ignored\":true"), std::string::npos) << r.to_json();

  // Mid-file: one GET, the bytes before the range discarded, the transfer cut after it.
  const std::size_t offset = (std::size_t{3} << 20) + 5, len = std::size_t{2} << 20;
  before = server_->request_lines().size();
  std::vector<char> mid(len, 'x');
  IoFuture part = f.pread(mid.data(), mid.size(), offset);
  ASSERT_EQ(part.get(), len);
  EXPECT_TRUE(std::equal(mid.begin(), mid.end(), data.begin() + static_cast<long>(offset)));
  EXPECT_EQ(gets_since(*server_, before).size(), 1u);
  EXPECT_EQ(part.route().source.gets, 1u);
  EXPECT_EQ(part.route().source.discarded, offset);

  // A gathered read of ranges in order: one GET too.
  before = server_->request_lines().size();
  std::vector<char> a(100), b(5000);
  const std::vector<ReadRange> ranges = {{10, a.size(), a.data()}, {7000000, b.size(), b.data()}};
  ASSERT_EQ(f.pread_gather(ranges).get(), a.size() + b.size());
  EXPECT_TRUE(std::equal(a.begin(), a.end(), data.begin() + 10));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), data.begin() + 7000000));
  EXPECT_EQ(gets_since(*server_, before).size(), 1u);
}

TEST_F(RemoteSource, AWholeObjectAnswerOfAnotherLengthOrCutShortIsAnError) {
  server_->set_ignore_ranges(true);
  server_->set_without_etags(true);
  put("c.bin", 100000);
  {
    File f(url("c.bin"), "r");
    put("c.bin", 90000, 2);  // replaced by a shorter object after the open
    std::vector<char> got(1000, 'x');
    try {
      f.read(got.data(), got.size(), 500);
      FAIL() << "read a replaced object";
    } catch (const IoError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(url("c.bin")), std::string::npos) << what;
      EXPECT_NE(what.find("offset=500"), std::string::npos) << what;
      EXPECT_NE(what.find("with 90000 B"), std::string::npos) << what;
      EXPECT_NE(what.find("was 100000 B when opened"), std::string::npos) << what;
    }
    EXPECT_EQ(std::count(got.begin(), got.end(), 'x'), 1000) << "bytes landed";
  }
  // A body that ends before the range: retried, then an error naming the URL and the range.
  File f(url("c.bin"), "r");
  server_->short_body_next(100);
  std::vector<char> got(1000);
  try {
    f.read(got.data(), got.size(), 80000);
    FAIL() << "read a body cut short";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(url("c.bin")), std::string::npos) << what;
    EXPECT_NE(what.find("offset=80000"), std::string::npos) << what;
    EXPECT_NE(what.find("after 4 attempts"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ferry
