// AWS Signature Version 4, computed by ferry, so that signed GETs and HEADs can be written on
// ferry's own connections (http_get.cc's direct path) instead of going through libcurl's transfer,
// which signs only what it sends itself. SHA-256 and HMAC come from OpenSSL's libcrypto, loaded at
// run time (the one dlopen of libcrypto.so.3; FERRY_CRYPTO_LIBRARY names another file): without
// it, signed requests keep libcurl's transfer. Pure functions of their arguments; thread-safe.
#pragma once

#include <ctime>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "remote/remote_url.h"

namespace ferry::remote {

// The SHA-256 of an empty payload: what a GET or HEAD signs, sent in x-amz-content-sha256 (S3
// and s3rver require the header).
inline constexpr const char* kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// Whether ferry can sign (libcrypto loaded); where not, *why_not says why.
bool can_sign(std::string* why_not);

// One request to sign: its headers as sent (names in any case; all of them are signed).
struct SigV4Request {
  std::string_view method;
  std::string_view path;   // as sent, already percent-encoded (S3 signs it as it is)
  std::string_view query;  // after the '?', as sent; may be empty
  std::vector<std::pair<std::string, std::string>> headers;
  std::string_view payload_sha256;  // hex, or "UNSIGNED-PAYLOAD"
};

// The Authorization header's value for `r`, signed at `amz_date` (YYYYMMDDTHHMMSSZ) for
// `region` and `service`. Needs can_sign().
std::string sigv4_authorization(const SigV4Request& r, const S3Credentials& credentials,
                                std::string_view region, std::string_view service,
                                std::string_view amz_date);

// The header lines ("Name: value\r\n" each) that sign an S3 request of `method` (GET or HEAD,
// no body) to `target` (path and query, as sent) on `host` (as sent in Host) at `now`:
// x-amz-date, x-amz-content-sha256 (the empty payload's hash), x-amz-security-token where a
// session token is set, and Authorization. Needs can_sign() and target.credentials.
std::string s3_signature_lines(std::string_view method, std::string_view host,
                               std::string_view request_target, const RemoteTarget& target,
                               std::time_t now);

}  // namespace ferry::remote
