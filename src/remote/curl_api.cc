#include "remote/curl_api.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <type_traits>

#include "base/library.h"
#include "ferry/remote.h"
#include "remote/sigv4.h"

namespace ferry::remote {
namespace {

struct Loaded {
  CurlApi api{};
  bool ok = false;
  std::string why_not;
};

#if FERRY_HAVE_CURL
// SigV4 signing (CURLOPT_AWS_SIGV4) arrived in 7.75.0.
constexpr unsigned kMinVersion = (7u << 16) | (75u << 8);

void bind(base::Symbols& s, CurlApi& a) {
  s.required(a.easy_init, "curl_easy_init");
  s.required(a.easy_setopt, "curl_easy_setopt");
  s.required(a.easy_perform, "curl_easy_perform");
  s.required(a.easy_getinfo, "curl_easy_getinfo");
  s.required(a.easy_reset, "curl_easy_reset");
  s.required(a.easy_cleanup, "curl_easy_cleanup");
  s.required(a.easy_strerror, "curl_easy_strerror");
  s.required(a.slist_append, "curl_slist_append");
  s.required(a.slist_free_all, "curl_slist_free_all");
  s.required(a.version_info, "curl_version_info");
  s.required(a.global_init, "curl_global_init");
  s.required(a.easy_send, "curl_easy_send");
  s.required(a.easy_recv, "curl_easy_recv");
}

Loaded load() {
  auto lib = base::load_library<CurlApi>(base::kCurlLibrary, bind);
  Loaded out{lib.table, false, {}};
  const std::string& name = lib.load.path;
  if (!lib.load.opened) {
    out.why_not =
        lib.load.not_found
            ? fmt::format("libcurl not found ({}): install libcurl4 for remote sources", name)
            : fmt::format("libcurl could not be loaded ({}): {}", name, lib.load.error);
    return out;
  }
  if (!lib.load.ok()) {
    out.why_not = fmt::format("{} lacks symbols: {}", name, fmt::join(lib.load.missing, ", "));
    return out;
  }
  const CurlApi& a = out.api;
  const curl_version_info_data* v = a.version_info(CURLVERSION_NOW);
  if (v == nullptr || v->version_num < kMinVersion) {
    out.why_not = fmt::format("{} is libcurl {}; remote sources need 7.75 or later (SigV4)", name,
                              v != nullptr ? v->version : "of unknown version");
    return out;
  }
  // Once, before any other thread uses the library (curl_global_init is not thread-safe).
  CURLcode rc = a.global_init(CURL_GLOBAL_DEFAULT);
  if (rc != CURLE_OK) {
    out.why_not = fmt::format("curl_global_init failed: {}", a.easy_strerror(rc));
    return out;
  }
  out.ok = true;
  return out;  // The handle stays open for the life of the process, on purpose.
}
#else
Loaded load() {
  Loaded out;
  out.why_not =
      "ferry was built without libcurl's headers (install libcurl4-openssl-dev and rebuild) "
      "for remote sources";
  return out;
}
#endif

const Loaded& loaded() {
  // Process-wide: libcurl is loaded once per process (one loader, src/base/library.h).
  static const Loaded l = load();
  return l;
}

}  // namespace

const CurlApi* curl_api(std::string* why_not) {
  const Loaded& l = loaded();
  if (!l.ok) {
    if (why_not != nullptr) *why_not = l.why_not;
    return nullptr;
  }
  return &l.api;
}

std::string curl_description() {
  const Loaded& l = loaded();
  if (!l.ok) return l.why_not;
#if FERRY_HAVE_CURL
  const curl_version_info_data* v = l.api.version_info(CURLVERSION_NOW);
  // Which way signed requests go: a named fallback, so `ferry check` says it.
  std::string why_not;
  const std::string signing = can_sign(&why_not)
                                  ? "SigV4 signed by ferry (libcrypto)"
                                  : "SigV4 signed by libcurl's transfer, not in place: " + why_not;
  return fmt::format("libcurl {} ({}); {}", v->version, v->ssl_version ? v->ssl_version : "no TLS",
                     signing);
#else
  return l.why_not;
#endif
}

}  // namespace ferry::remote

namespace ferry {

RemoteSupport remote_support() {
  std::string why_not;
  const bool ok = remote::curl_api(&why_not) != nullptr;
  return {ok, remote::curl_description()};
}

}  // namespace ferry
