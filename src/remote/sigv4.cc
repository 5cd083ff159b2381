#include "remote/sigv4.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <type_traits>

#include "base/library.h"
#include "base/text.h"

#if __has_include(<openssl/hmac.h>)
#include <openssl/hmac.h>
#include <openssl/sha.h>
#define FERRY_HAVE_OPENSSL_HEADERS 1
#endif

struct evp_md_st;  // OpenSSL's EVP_MD, opaque

namespace ferry::remote {
namespace {

// libcrypto's one-shot SHA256() and HMAC(), the same in OpenSSL 1.1 and 3 (neither deprecated in
// 3). Declared here, so that ferry builds without libssl-dev; where its headers are present, the
// declarations are checked against them below. EVP_sha256() gives the EVP_MD that HMAC() needs.
struct CryptoApi {
  unsigned char* (*sha256)(const unsigned char* data, std::size_t n, unsigned char* md);
  const evp_md_st* (*evp_sha256)();
  unsigned char* (*hmac)(const evp_md_st* evp_md, const void* key, int key_len,
                         const unsigned char* data, std::size_t n, unsigned char* md,
                         unsigned int* md_len);
};

#ifdef FERRY_HAVE_OPENSSL_HEADERS
static_assert(std::is_same_v<decltype(&::SHA256), decltype(CryptoApi::sha256)>);
static_assert(std::is_same_v<decltype(&::EVP_sha256), decltype(CryptoApi::evp_sha256)>);
static_assert(std::is_same_v<decltype(&::HMAC), decltype(CryptoApi::hmac)>);
#endif

struct Loaded {
  CryptoApi api{};
  bool ok = false;
  std::string why_not;
};

// Dlopened beside libcurl rather than linked: libferry links nothing it can run without (libcuda,
// libcufile, libcurl are all loaded at run time), a static libferry would hand OpenSSL to every
// consumer's link, and where libcurl is Debian's libcurl4 (the OpenSSL build) libcrypto.so.3 is
// already in the process. Without it nothing fails: signed requests take libcurl's transfer.
Loaded load() {
  auto lib =
      base::load_library<CryptoApi>(base::kCryptoLibrary, [](base::Symbols& s, CryptoApi& a) {
        s.required(a.sha256, "SHA256");
        s.required(a.evp_sha256, "EVP_sha256");
        s.required(a.hmac, "HMAC");
      });
  Loaded out{lib.table, false, {}};
  if (!lib.load.opened) {
    out.why_not = fmt::format("{} could not be loaded: {}", lib.load.path, lib.load.error);
  } else if (!lib.load.ok()) {
    out.why_not = fmt::format("{} lacks {}", lib.load.path, fmt::join(lib.load.missing, ", "));
  } else {
    out.ok = true;
  }
  return out;
}

const Loaded& loaded() {
  static const Loaded l = load();  // once per process, as every library ferry loads
  return l;
}

using Digest = std::array<unsigned char, 32>;

Digest sha256(std::string_view text) {
  Digest d{};
  loaded().api.sha256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), d.data());
  return d;
}

Digest hmac(std::string_view key, std::string_view text) {
  Digest d{};
  unsigned int n = 0;
  const CryptoApi& a = loaded().api;
  a.hmac(a.evp_sha256(), key.data(), static_cast<int>(key.size()),
         reinterpret_cast<const unsigned char*>(text.data()), text.size(), d.data(), &n);
  return d;
}

std::string_view view(const Digest& d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

std::string hex(const Digest& d) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * d.size());
  for (unsigned char c : d) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

bool unreserved(unsigned char c) {
  return std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
}

// A query name or value as SigV4 canonicalises it: unreserved bytes as they are, an existing
// %XX escape kept (in capitals), every other byte escaped. A URL's query arrives encoded once
// already, so this encodes only what its writer left raw.
std::string canonical_component(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (unreserved(c)) {
      out += static_cast<char>(c);
    } else if (c == '%' && i + 2 < s.size() &&
               std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
               std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += '%';
      out += static_cast<char>(std::toupper(static_cast<unsigned char>(s[++i])));
      out += static_cast<char>(std::toupper(static_cast<unsigned char>(s[++i])));
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

// Its pairs, each name and value canonicalised, sorted by name then value, joined by '&'.
std::string canonical_query(std::string_view query) {
  std::vector<std::pair<std::string, std::string>> pairs;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    pairs.emplace_back(
        canonical_component(pair.substr(0, eq)),
        eq == std::string_view::npos ? std::string() : canonical_component(pair.substr(eq + 1)));
  }
  std::sort(pairs.begin(), pairs.end());
  std::string out;
  for (const auto& [name, value] : pairs) {
    if (!out.empty()) out += '&';
    out += name + '=' + value;
  }
  return out;
}

// A header's value as signed: trimmed, each run of spaces one space.
std::string canonical_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace

bool can_sign(std::string* why_not) {
  const Loaded& l = loaded();
  if (!l.ok && why_not != nullptr) *why_not = l.why_not;
  return l.ok;
}

std::string sigv4_authorization(const SigV4Request& r, const S3Credentials& credentials,
                                std::string_view region, std::string_view service,
                                std::string_view amz_date) {
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& [name, value] : r.headers) {
    headers.emplace_back(base::lower(name), canonical_value(value));
  }
  std::sort(headers.begin(), headers.end());
  std::string canonical_headers, signed_headers;
  for (const auto& [name, value] : headers) {
    canonical_headers += name + ':' + value + '\n';
    if (!signed_headers.empty()) signed_headers += ';';
    signed_headers += name;
  }
  const std::string canonical_request = fmt::format(
      "{}\n{}\n{}\n{}\n{}\n{}", r.method, r.path.empty() ? std::string_view("/") : r.path,
      canonical_query(r.query), canonical_headers, signed_headers, r.payload_sha256);
  const std::string_view day = amz_date.substr(0, 8);
  const std::string scope = fmt::format("{}/{}/{}/aws4_request", day, region, service);
  const std::string string_to_sign =
      fmt::format("AWS4-HMAC-SHA256\n{}\n{}\n{}", amz_date, scope, hex(sha256(canonical_request)));
  const Digest key_day = hmac("AWS4" + credentials.secret_key, day);
  const Digest key_region = hmac(view(key_day), region);
  const Digest key_service = hmac(view(key_region), service);
  const Digest key = hmac(view(key_service), "aws4_request");
  return fmt::format("AWS4-HMAC-SHA256 Credential={}/{}, SignedHeaders={}, Signature={}",
                     credentials.access_key, scope, signed_headers,
                     hex(hmac(view(key), string_to_sign)));
}

std::string s3_signature_lines(std::string_view method, std::string_view host,
                               std::string_view request_target, const RemoteTarget& target,
                               std::time_t now) {
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char amz_date[17];
  std::strftime(amz_date, sizeof amz_date, "%Y%m%dT%H%M%SZ", &utc);
  const S3Credentials& c = *target.credentials;
  const std::size_t q = request_target.find('?');
  SigV4Request r;
  r.method = method;
  r.path = request_target.substr(0, q);
  r.query = q == std::string_view::npos ? std::string_view() : request_target.substr(q + 1);
  r.payload_sha256 = kEmptyPayloadSha256;
  r.headers = {{"host", std::string(host)},
               {"x-amz-content-sha256", kEmptyPayloadSha256},
               {"x-amz-date", amz_date}};
  if (!c.session_token.empty()) r.headers.emplace_back("x-amz-security-token", c.session_token);
  std::string lines;
  for (const auto& [name, value] : r.headers) {
    if (name != "host") lines += fmt::format("{}: {}\r\n", name, value);
  }
  lines += fmt::format("Authorization: {}\r\n",
                       sigv4_authorization(r, c, target.region, "s3", amz_date));
  return lines;
}

}  // namespace ferry::remote
