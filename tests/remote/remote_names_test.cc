// What a remote object's name shows and names (issue 45, part B): credentials in a URL never
// reach a message or report, a checkpoint's kind is told from its URL's path, an index cannot
// name a shard outside its prefix however it spells it, and a bucket is not an object. Against
// the test HTTP server (tests/remote/http_server.h) on 127.0.0.1.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "ferry/checkpoint.h"
#include "ferry/checkpoint_writer.h"
#include "ferry/error.h"
#include "ferry/file.h"
#include "ferry/remote.h"
#include "served_folder.h"
#include "test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using test::HttpServer;
using test::ScopedEnv;

class RemoteNames : public test::ServedFolder {
 protected:
  void put(const std::string& name, const std::string& text) {
    fs::create_directories((root_ / name).parent_path());
    std::ofstream(root_ / name, std::ios::binary) << text;
  }
  std::string url(const std::string& name) const { return server_->url(name); }
  // What `open` threw, or "" when it did not throw that type.
  template <class E, class F>
  static std::string error_of(F open) {
    try {
      open();
    } catch (const E& e) {
      return e.what();
    }
    return "";
  }

  ScopedEnv fast_retries_{"FERRY_REMOTE_RETRIES", "0"};
};

TEST(ShownPath, CutsTheQueryWhereEveryKindOfSignatureLies) {
  for (const char* query :
       {"X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDSECRET%2F20260101&"
        "X-Amz-Security-Token=toksecret&X-Amz-Signature=sigsecret",
        "sv=2022&sig=sassecret", "Expires=1&Signature=cfsecret&Key-Pair-Id=K", "token=toksecret",
        "access_token=toksecret"}) {
    const std::string shown = shown_path(std::string("https://host/b/model.safetensors?") + query);
    EXPECT_EQ(shown, "https://host/b/model.safetensors?...") << query;
  }
  EXPECT_EQ(shown_path("https://host/a.bin#sigsecret"), "https://host/a.bin?...");
  EXPECT_EQ(shown_path("S3://bucket/key"), "S3://bucket/key");
}

TEST(ShownPath, DropsUserAndPasswordWhereverTheirAtSignLies) {
  EXPECT_EQ(shown_path("http://alice:hunter2@host:8080/x.bin"), "http://host:8080/x.bin");
  EXPECT_EQ(shown_path("http://alice:hun@ter2@host/x.bin?q"), "http://host/x.bin?...");
  // A password holding '?' or '#' is not cut there (its start would be shown).
  EXPECT_EQ(shown_path("https://alice:hun?ter2@host/x.bin"), "https://host/x.bin");
  EXPECT_EQ(shown_path("https://alice:hun#ter2@host/x.bin"), "https://host/x.bin");
  EXPECT_EQ(shown_path("https://alice:hunter2@host"), "https://host");
  // An '@' in the path is the path's.
  EXPECT_EQ(shown_path("https://host/a@b.bin"), "https://host/a@b.bin");
}

TEST(ShownPath, RedactsAUrlOfASchemeFerryDoesNotRead) {
  // Refused, but named in the error: its credentials must not be.
  EXPECT_EQ(shown_path("ftp://alice:hunter2@host/x?sig=s"), "ftp://host/x?...");
  EXPECT_EQ(shown_path("webhdfs+x://alice:hunter2@host/x"), "webhdfs+x://host/x");
  EXPECT_EQ(shown_path("://alice:hunter2@host/x"), "://alice:hunter2@host/x");  // no scheme
}

TEST(ShownPath, LeavesALocalPathAsItIs) {
  EXPECT_EQ(shown_path("/data/what?.bin"), "/data/what?.bin");
  EXPECT_EQ(shown_path("dir/a#b@c.safetensors"), "dir/a#b@c.safetensors");
  EXPECT_TRUE(is_remote_url("HTTPS://host/x"));
  EXPECT_FALSE(is_remote_url("/data/http://x"));
}

// Issue 45 B10: S3 answers a GET of a bucket with its listing, which was read as the object.
TEST_F(RemoteNames, ABucketWithoutAKeyIsRefusedBeforeAnyRequest) {
  put("bucket/k.bin", "data");
  ScopedEnv endpoint("AWS_ENDPOINT_URL", server_->url("").c_str());
  ScopedEnv id("AWS_ACCESS_KEY_ID", nullptr);
  ScopedEnv secret("AWS_SECRET_ACCESS_KEY", nullptr);
  for (const char* bucket : {"s3://bucket/", "s3://bucket"}) {
    const std::string what = error_of<IoError>([&] { File f(bucket, "r"); });
    EXPECT_NE(what.find(std::string("open ") + bucket + ": names a bucket, not an object"),
              std::string::npos)
        << what;
  }
  EXPECT_EQ(server_->requests(), 0u);
  File f("s3://bucket/k.bin", "r");
  EXPECT_EQ(f.size(), 4u);
}

// Issue 45 B6: past 128 shards a checkpoint opens each shard again for a load; it did so by the
// shard's shown name, so a URL's user:password@ was lost and those GETs went unauthenticated.
TEST_F(RemoteNames, ShardsOpenedAgainKeepTheUrlsPassword) {
  std::vector<std::uint32_t> values(130);
  std::vector<TensorSource> tensors;
  for (std::uint32_t i = 0; i < values.size(); ++i) {
    values[i] = i;
    tensors.push_back({"t" + std::to_string(1000 + i), Dtype::kU32, {1}, &values[i], 4});
  }
  SaveOptions one_per_shard;
  one_per_shard.max_shard_size = 1;
  save_checkpoint(tensors, root_ / "many", one_per_shard);
  const std::string with_password = "http://alice:hunter2@" + url("many/").substr(7);
  Checkpoint ckpt(with_password);
  ASSERT_EQ(ckpt.shards().size(), 130u);
  LoadOptions host;
  host.memory = MemoryKind::kHostPageable;
  const LoadResult got = ckpt.load(host);
  for (std::size_t i = 0; i < got.tensors.size(); ++i) {
    EXPECT_EQ(*static_cast<const std::uint32_t*>(got.tensors[i].data), i);
  }
  const auto lines = server_->request_lines();
  const auto headers = server_->request_headers();
  for (std::size_t i = 0; i < headers.size(); ++i) {
    EXPECT_TRUE(headers[i].contains("authorization")) << lines[i];
  }
  for (const std::string& shard : ckpt.shards()) {
    EXPECT_EQ(shard.find("hunter2"), std::string::npos) << shard;
  }
}

// Issue 45 B9: a server decodes %2F and %2E before it resolves "..", so an index naming
// "..%2Fother/model.safetensors" reached outside the checkpoint's prefix. Refused, however
// encoded, before any request for the shard.
TEST_F(RemoteNames, AnIndexCannotLeaveItsPrefixByPercentEncoding) {
  for (const char* shard :
       {"..%2Fother%2Fmodel.safetensors", "%2E%2E/other/model.safetensors",
        "sub/%2e%2E%2f..%2Fx.safetensors", "..%252Fother.safetensors", "%2Fetc/x.safetensors",
        "..%5Cx.safetensors", "x%3A%2F%2Fhost%2Fy.safetensors", "x%00.safetensors"}) {
    put("evil/model.safetensors.index.json",
        std::string(R"({"weight_map": {"w": ")") + shard + R"("}})");
    const std::size_t before = server_->requests();
    const std::string what = error_of<CheckpointError>([&] { Checkpoint c(url("evil/")); });
    EXPECT_TRUE(what.find("is not a plain name beside the index") != std::string::npos ||
                what.find("NUL") != std::string::npos)
        << shard << ": " << what;
    // Only the index was asked for (its HEAD and GET), never the shard.
    for (std::size_t i = before; i < server_->request_lines().size(); ++i) {
      EXPECT_NE(server_->request_lines()[i].find("model.safetensors.index.json"), std::string::npos)
          << shard << ": " << server_->request_lines()[i];
    }
  }
}

}  // namespace
}  // namespace ferry
