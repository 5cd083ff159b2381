// What a remote object's name shows and names (issue 45, part B): credentials in a URL never
// reach a message or report, a checkpoint's kind is told from its URL's path, an index cannot
// name a shard outside its prefix however it spells it, and a bucket is not an object. Against
// the test HTTP server (tests/remote/http_server.h) on 127.0.0.1.
#include <gtest/gtest.h>

#include <string>

#include "ferry/remote.h"

namespace ferry {
namespace {

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

TEST(ShownPath, LeavesALocalPathAsItIs) {
  EXPECT_EQ(shown_path("/data/what?.bin"), "/data/what?.bin");
  EXPECT_EQ(shown_path("dir/a#b@c.safetensors"), "dir/a#b@c.safetensors");
  EXPECT_TRUE(is_remote_url("HTTPS://host/x"));
  EXPECT_FALSE(is_remote_url("/data/http://x"));
}

}  // namespace
}  // namespace ferry
