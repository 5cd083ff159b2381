#include "remote/remote_url.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "base/text.h"
#include "ferry/error.h"

namespace ferry::remote {
namespace {

using base::starts_with_nocase;

std::string env_or(const Getenv& getenv, const char* name, std::string fallback = {}) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// The text between <tag> and </tag>, or empty.
std::string element(std::string_view body, std::string_view tag) {
  const std::string open = fmt::format("<{}>", tag);
  const std::string close = fmt::format("</{}>", tag);
  std::size_t a = body.find(open);
  if (a == std::string_view::npos) return {};
  a += open.size();
  std::size_t b = body.find(close, a);
  if (b == std::string_view::npos) return {};
  return std::string(body.substr(a, std::min<std::size_t>(b - a, 512)));
}

}  // namespace

std::string encode_key(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

std::string s3_error_words(std::string_view body) {
  std::string code = element(body, "Code");
  std::string message = element(body, "Message");
  if (code.empty()) return message;
  if (message.empty()) return code;
  return fmt::format("{}: {}", code, message);
}

RemoteTarget resolve_remote(std::string_view url, const Getenv& getenv) {
  RemoteTarget t;
  t.given = shown_url(url);
  if (url.find('\0') != std::string_view::npos) {
    throw Error("a NUL byte in the URL");
  }
  if (!starts_with_nocase(url, "s3://")) {
    const std::size_t host = url.find("://") + 3;
    if (host >= url.size() || url[host] == '/') {
      throw Error("no host in the URL");
    }
    t.url = std::string(url);
    t.shown = t.given;
    const bool presigned = url.find("X-Amz-Signature=") != std::string_view::npos ||
                           url.find("x-amz-signature=") != std::string_view::npos;
    t.auth = presigned ? "presigned URL (its query carries the signature)" : "none";
    return t;
  }
  std::string_view rest = url.substr(5);
  const std::size_t slash = rest.find('/');
  const std::string_view bucket = rest.substr(0, slash);
  const std::string_view key = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
  if (bucket.empty()) throw Error("no bucket in the s3:// URL");
  if (url.find_first_of("?#") != std::string_view::npos) {
    throw Error(
        fmt::format("{}: an s3:// URL takes no query; give a presigned URL as https://", t.given));
  }
  if (key.empty()) {
    // S3 answers a GET of the bucket with its listing, which would be read as the object's bytes.
    throw Error("names a bucket, not an object: give the object's key (s3://BUCKET/KEY)");
  }
  t.s3 = true;
  t.region = env_or(getenv, "AWS_REGION", env_or(getenv, "AWS_DEFAULT_REGION", "us-east-1"));
  std::string endpoint =
      env_or(getenv, "AWS_ENDPOINT_URL_S3", env_or(getenv, "AWS_ENDPOINT_URL", ""));
  if (!endpoint.empty()) {
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    if (!starts_with_nocase(endpoint, "http://") && !starts_with_nocase(endpoint, "https://")) {
      throw Error(
          fmt::format("AWS_ENDPOINT_URL={}: not an http:// or https:// URL", shown_url(endpoint)));
    }
    t.url = fmt::format("{}/{}/{}", endpoint, bucket, encode_key(key));
  } else {
    t.url = fmt::format("https://{}.s3.{}.amazonaws.com/{}", bucket, t.region, encode_key(key));
  }
  t.shown = shown_url(t.url);
  const std::string id = env_or(getenv, "AWS_ACCESS_KEY_ID");
  const std::string secret = env_or(getenv, "AWS_SECRET_ACCESS_KEY");
  if (!id.empty() && !secret.empty()) {
    t.credentials = S3Credentials{id, secret, env_or(getenv, "AWS_SESSION_TOKEN")};
    t.auth = fmt::format("SigV4, region {}, key from AWS_ACCESS_KEY_ID{}", t.region,
                         t.credentials->session_token.empty() ? "" : " with AWS_SESSION_TOKEN");
  } else if (!id.empty() || !secret.empty()) {
    throw Error(
        fmt::format("{}: {} is set but {} is not; set both to sign, or neither for "
                    "anonymous access",
                    t.given, id.empty() ? "AWS_SECRET_ACCESS_KEY" : "AWS_ACCESS_KEY_ID",
                    id.empty() ? "AWS_ACCESS_KEY_ID" : "AWS_SECRET_ACCESS_KEY"));
  } else {
    t.auth = "anonymous (AWS_ACCESS_KEY_ID is not set)";
  }
  return t;
}

}  // namespace ferry::remote
