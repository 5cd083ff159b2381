// libcurl, loaded at run time: the one dlopen of libcurl.so.4 (FERRY_CURL_LIBRARY names another
// file, for tests). ferry builds where libcurl's headers are absent and runs where the library
// is: remote sources then fail with the reason that curl_api() gives. Thread-safe.
#pragma once

#if __has_include(<curl/curl.h>)
#include <curl/curl.h>
#define FERRY_HAVE_CURL 1
#else
#define FERRY_HAVE_CURL 0
#endif

#include <string>

namespace ferry::remote {

#if FERRY_HAVE_CURL
// The functions ferry calls, resolved once. curl_global_init has run when the table is given out.
struct CurlApi {
  CURL* (*easy_init)();
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...);
  CURLcode (*easy_perform)(CURL*);
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...);
  void (*easy_reset)(CURL*);
  void (*easy_cleanup)(CURL*);
  const char* (*easy_strerror)(CURLcode);
  curl_slist* (*slist_append)(curl_slist*, const char*);
  void (*slist_free_all)(curl_slist*);
  curl_version_info_data* (*version_info)(CURLversion);
  CURLcode (*global_init)(long);
  CURLcode (*easy_send)(CURL*, const void*, size_t, size_t*);
  CURLcode (*easy_recv)(CURL*, void*, size_t, size_t*);
};
#else
struct CurlApi {};
#endif

// The loaded library, or null with *why_not saying why (not found, too old, built without its
// headers).
const CurlApi* curl_api(std::string* why_not);

// "libcurl 7.88.1 (OpenSSL/3.0.19); SigV4 signed by ferry (libcrypto)" (or by libcurl's
// transfer, and why), or why remote sources are unavailable.
std::string curl_description();

}  // namespace ferry::remote
