#include "remote/http_get.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

namespace ferry::remote {

#if FERRY_HAVE_CURL
namespace {

// The SHA-256 of an empty payload: what a GET or HEAD signs. libcurl 7.88 adds no
// x-amz-content-sha256 header itself, and S3 wants one; sending the hash it signed keeps the two
// in agreement whichever way a libcurl version treats a header given to it.
constexpr const char* kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr std::size_t kErrorBodyMax = 16 << 10;

// The calling thread's handle. Its connections stay open between requests (keep-alive); a child
// made by fork() leaves its parent's handle alone (the sockets are shared with the parent) and
// makes its own.
struct ThreadHandle {
  CURL* handle = nullptr;
  pid_t pid = 0;
  const CurlApi* api = nullptr;
  ~ThreadHandle() {
    if (handle != nullptr && pid == ::getpid()) api->easy_cleanup(handle);
  }
};

CURL* thread_handle(const CurlApi& api) {
  thread_local ThreadHandle t;
  const pid_t me = ::getpid();
  if (t.handle != nullptr && t.pid != me) t.handle = nullptr;
  if (t.handle == nullptr) {
    t.handle = api.easy_init();
    t.pid = me;
    t.api = &api;
  } else {
    api.easy_reset(t.handle);  // options go; the connection cache stays
  }
  return t.handle;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

struct Exchange {
  const CurlApi* api = nullptr;
  CURL* handle = nullptr;
  HttpAnswer* answer = nullptr;
  std::string content_range;
  // A ranged GET's destination; null for HEAD and for error bodies.
  char* buffer = nullptr;
  std::uint64_t offset = 0;
  std::size_t size = 0;
  std::uint64_t object_size = 0;
  const std::string* etag = nullptr;
  bool probe = false;          // GET bytes=0-0 to learn the size: nothing lands
  bool probe_stopped = false;  // the probe's answer was a success: its body is not wanted
  bool checked = false;        // the status and headers were checked at the first body byte
  bool error_answer = false;
};

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto& x = *static_cast<Exchange*>(user);
  const std::string_view line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new answer (after a redirect or 100 Continue)
    x.content_range.clear();
    x.answer->etag.clear();
    x.answer->retry_after.clear();
    return size * n;
  }
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  const std::string name = lower(line.substr(0, colon));
  const std::string value = trim(line.substr(colon + 1));
  if (name == "content-range") x.content_range = value;
  if (name == "etag") x.answer->etag = value;
  if (name == "retry-after") x.answer->retry_after = value;
  return size * n;
}

// Parses "bytes A-B/TOTAL" (or "bytes */TOTAL"); false when it is not that.
bool parse_content_range(std::string_view v, std::uint64_t* a, std::uint64_t* b,
                         std::uint64_t* total) {
  if (v.rfind("bytes ", 0) != 0) return false;
  v.remove_prefix(6);
  const std::size_t slash = v.find('/');
  if (slash == std::string_view::npos) return false;
  auto number = [](std::string_view s, std::uint64_t* out) {
    if (s.empty() || s.size() > 19) return false;
    std::uint64_t x = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      x = x * 10 + static_cast<std::uint64_t>(c - '0');
    }
    *out = x;
    return true;
  };
  if (!number(v.substr(slash + 1), total)) return false;
  const std::string_view span = v.substr(0, slash);
  if (span == "*") {
    *a = *b = 0;
    return true;
  }
  const std::size_t dash = span.find('-');
  return dash != std::string_view::npos && number(span.substr(0, dash), a) &&
         number(span.substr(dash + 1), b);
}

// The first body byte: is this the answer asked for? Sets answer->refused when not.
void check_answer(Exchange& x) {
  x.checked = true;
  HttpAnswer& a = *x.answer;
  long status = 0;
  x.api->easy_getinfo(x.handle, CURLINFO_RESPONSE_CODE, &status);
  a.status = status;
  if (status < 200 || status > 299) {
    x.error_answer = true;
    return;
  }
  if (x.probe) return;
  if (status == 200) {
    if (x.offset == 0 && x.size == x.object_size) return;  // the whole object, as asked
    a.refused = fmt::format(
        "the server answered 200 (the whole object) to a request for bytes {}-{}: it ignored "
        "the Range header",
        x.offset, x.offset + x.size - 1);
    return;
  }
  if (status != 206) {
    a.refused = fmt::format("the server answered {} to a range request", status);
    return;
  }
  std::uint64_t first = 0, last = 0, total = 0;
  if (!parse_content_range(x.content_range, &first, &last, &total) || first != x.offset ||
      last != x.offset + x.size - 1) {
    a.refused = fmt::format("the server answered bytes {} to a request for bytes {}-{}",
                            x.content_range.empty() ? "(no Content-Range)" : x.content_range,
                            x.offset, x.offset + x.size - 1);
    return;
  }
  if (total != x.object_size) {
    a.refused = fmt::format(
        "the object is now {} B, not the {} B it was when opened: it changed during the read",
        total, x.object_size);
    return;
  }
  if (x.etag != nullptr && !x.etag->empty() && !a.etag.empty() && a.etag != *x.etag) {
    a.refused = fmt::format("the object's ETag is now {}, not {}: it changed during the read",
                            a.etag, *x.etag);
  }
}

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto& x = *static_cast<Exchange*>(user);
  const std::size_t bytes = size * n;
  if (!x.checked) check_answer(x);
  HttpAnswer& a = *x.answer;
  if (x.probe && !x.error_answer) {
    // Some servers answer bytes=0-0 with the whole object (s3rver 3.7): the headers said
    // enough, so stop here rather than download it.
    x.probe_stopped = true;
    return 0;
  }
  if (x.error_answer) {
    if (a.body.size() < kErrorBodyMax) {
      a.body.append(data, std::min(bytes, kErrorBodyMax - a.body.size()));
    }
    return bytes;
  }
  if (!a.refused.empty()) return 0;  // aborts the transfer: nothing lands
  if (a.landed + bytes > x.size) {
    a.refused = fmt::format("the server sent more than the {} B of bytes {}-{}", x.size, x.offset,
                            x.offset + x.size - 1);
    return 0;
  }
  std::memcpy(x.buffer + a.landed, data, bytes);
  a.landed += bytes;
  return bytes;
}

struct Request {
  const CurlApi& api;
  CURL* handle;
  curl_slist* headers = nullptr;
  char error[CURL_ERROR_SIZE] = {};

  Request(const CurlApi& a, const RemoteTarget& target, const Timeouts& timeouts)
      : api(a), handle(thread_handle(a)) {
    api.easy_setopt(handle, CURLOPT_URL, target.url.c_str());
    api.easy_setopt(handle, CURLOPT_ERRORBUFFER, error);
    api.easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    api.easy_setopt(handle, CURLOPT_TCP_KEEPALIVE, 1L);
    api.easy_setopt(handle, CURLOPT_TCP_NODELAY, 1L);
    api.easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, timeouts.connect_ms);
    api.easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, 1L);
    api.easy_setopt(handle, CURLOPT_LOW_SPEED_TIME, timeouts.stall_seconds);
    api.easy_setopt(handle, CURLOPT_FOLLOWLOCATION, 1L);
    api.easy_setopt(handle, CURLOPT_MAXREDIRS, 5L);
    api.easy_setopt(handle, CURLOPT_USERAGENT, "ferry");
    // The largest receive buffer libcurl takes: fewer, larger copies into the destination.
    api.easy_setopt(handle, CURLOPT_BUFFERSIZE, 512L << 10);
#if LIBCURL_VERSION_NUM >= 0x075500
    api.easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
    api.easy_setopt(handle, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#endif
    for (const char* name : {"CURL_CA_BUNDLE", "SSL_CERT_FILE"}) {
      const char* ca = std::getenv(name);
      if (ca != nullptr && *ca != '\0') {
        api.easy_setopt(handle, CURLOPT_CAINFO, ca);
        break;
      }
    }
    if (target.credentials) {
      const std::string sigv4 = fmt::format("aws:amz:{}:s3", target.region);
      api.easy_setopt(handle, CURLOPT_AWS_SIGV4, sigv4.c_str());
      api.easy_setopt(handle, CURLOPT_USERNAME, target.credentials->access_key.c_str());
      api.easy_setopt(handle, CURLOPT_PASSWORD, target.credentials->secret_key.c_str());
      add(fmt::format("x-amz-content-sha256: {}", kEmptyPayloadSha256));
      if (!target.credentials->session_token.empty()) {
        add("x-amz-security-token: " + target.credentials->session_token);
      }
    }
  }
  // The handle keeps pointers into this frame until the thread's next request resets it; no
  // transfer runs in between.
  ~Request() {
    if (headers != nullptr) api.slist_free_all(headers);
  }
  void add(const std::string& header) { headers = api.slist_append(headers, header.c_str()); }

  void perform(Exchange& x, HttpAnswer& a) {
    x.api = &api;
    x.handle = handle;
    x.answer = &a;
    if (headers != nullptr) api.easy_setopt(handle, CURLOPT_HTTPHEADER, headers);
    api.easy_setopt(handle, CURLOPT_HEADERFUNCTION, &on_header);
    api.easy_setopt(handle, CURLOPT_HEADERDATA, &x);
    api.easy_setopt(handle, CURLOPT_WRITEFUNCTION, &on_body);
    api.easy_setopt(handle, CURLOPT_WRITEDATA, &x);
    const CURLcode rc = api.easy_perform(handle);
    long connects = 0;
    api.easy_getinfo(handle, CURLINFO_NUM_CONNECTS, &connects);
    a.new_connections = connects;
    if (a.status == 0) api.easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &a.status);
    if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && (!a.refused.empty() || x.probe_stopped))) {
      a.transport_ok = true;
      return;
    }
    a.curl_code = static_cast<int>(rc);
    a.transport_error = error[0] != '\0' ? fmt::format("{} ({})", api.easy_strerror(rc), error)
                                         : std::string(api.easy_strerror(rc));
  }
};

}  // namespace

HttpAnswer http_head(const CurlApi& api, const RemoteTarget& target, const Timeouts& timeouts,
                     bool probe_range) {
  HttpAnswer a;
  Request r(api, target, timeouts);
  Exchange x;
  if (probe_range) {
    x.probe = true;
    api.easy_setopt(r.handle, CURLOPT_RANGE, "0-0");
  } else {
    api.easy_setopt(r.handle, CURLOPT_NOBODY, 1L);
  }
  r.perform(x, a);
  if (!a.transport_ok) return a;
  if (probe_range) {
    std::uint64_t first = 0, last = 0, total = 0;
    if (a.status == 206 || a.status == 416) {
      if (parse_content_range(x.content_range, &first, &last, &total)) a.length = a.total = total;
    } else if (a.status == 200) {
      // The whole object instead of its first byte: its length is the object's size.
      curl_off_t length = -1;
      api.easy_getinfo(r.handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
      a.length = length < 0 ? 0 : static_cast<std::uint64_t>(length);
    }
    if (a.status == 416 && !x.content_range.empty()) a.status = 206;
    return a;
  }
  curl_off_t length = -1;
  api.easy_getinfo(r.handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
  a.length = length < 0 ? 0 : static_cast<std::uint64_t>(length);
  return a;
}

HttpAnswer http_get_range(const CurlApi& api, const RemoteTarget& target, const Timeouts& timeouts,
                          std::uint64_t object_size, const std::string& etag, char* buffer,
                          std::uint64_t offset, std::size_t size) {
  HttpAnswer a;
  Request r(api, target, timeouts);
  const std::string range = fmt::format("{}-{}", offset, offset + size - 1);
  api.easy_setopt(r.handle, CURLOPT_RANGE, range.c_str());
  if (!etag.empty()) r.add("If-Match: " + etag);
  Exchange x;
  x.buffer = buffer;
  x.offset = offset;
  x.size = size;
  x.object_size = object_size;
  x.etag = &etag;
  r.perform(x, a);
  if (a.transport_ok && a.refused.empty() && a.status >= 200 && a.status <= 299 &&
      a.landed != size) {
    if (!x.checked) check_answer(x);
    if (a.refused.empty()) {
      a.refused = fmt::format("the answer held {} B of the {} B of bytes {}-{}", a.landed, size,
                              offset, offset + size - 1);
    }
  }
  return a;
}

#else

HttpAnswer http_head(const CurlApi&, const RemoteTarget&, const Timeouts&, bool) { return {}; }
HttpAnswer http_get_range(const CurlApi&, const RemoteTarget&, const Timeouts&, std::uint64_t,
                          const std::string&, char*, std::uint64_t, std::size_t) {
  return {};
}

#endif

}  // namespace ferry::remote
