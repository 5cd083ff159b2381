// Remote sources by URL: what `http://`, `https://` and `s3://` name, where their requests go,
// and how they are authenticated, from the URL and the AWS_* variables as users set them. Pure
// functions of their arguments (the environment is passed in), so tests need no server.
// Credentials live in `S3Credentials` only: no other string made here holds one.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "io/io_seam.h"

namespace ferry::remote {

using io::shown_url;

struct S3Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // AWS_SESSION_TOKEN; empty when none
};

struct RemoteTarget {
  std::string url;    // where GETs go (s3:// made into its endpoint's URL); may hold a query
  std::string shown;  // the URL for messages and reports: the query (a presigned signature) cut
  std::string given;  // the URL as given, shown the same way
  bool s3 = false;    // s3://: signed with SigV4 where credentials are set
  std::string region;
  std::optional<S3Credentials> credentials;
  std::string auth;  // in words: "SigV4 (region us-east-1, key from AWS_ACCESS_KEY_ID)", ...
};

// Reads a variable of the environment (std::getenv in production; a map in tests).
using Getenv = std::function<const char*(const char*)>;

// Resolves `url`; throws ferry::Error saying what is wrong with it (the caller names the URL).
// s3:// goes to AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, path-style (`ENDPOINT/bucket/key`), else
// to `https://bucket.s3.REGION.amazonaws.com/key`; the region is AWS_REGION, AWS_DEFAULT_REGION or
// us-east-1; requests are signed when AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are both set,
// anonymous otherwise (public buckets). http(s):// URLs go as given; one whose query carries
// X-Amz-Signature is a presigned URL.
RemoteTarget resolve_remote(std::string_view url, const Getenv& getenv);

// Percent-encodes an S3 key for a URL path: every byte but A-Z a-z 0-9 - _ . ~ and '/'.
std::string encode_key(std::string_view key);

// The text of <Code> and <Message> in an S3 (or S3-like) XML error body, as "Code: Message";
// empty when the body has neither.
std::string s3_error_words(std::string_view body);

}  // namespace ferry::remote
