#include "remote/http_get.h"

#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "base/text.h"
#include "remote/sigv4.h"
#include "remote/transfer_watch.h"

namespace ferry::remote {

#if FERRY_HAVE_CURL
namespace {

constexpr std::size_t kErrorBodyMax = 16 << 10;

// A libcurl easy handle and the sockets it reports. A child made by fork() shares its parent's
// sockets: it forgets the parent's handle, never cleans it up, and makes its own.
struct ProcessHandle {
  const CurlApi* api = nullptr;
  CURL* handle = nullptr;
  pid_t pid = 0;
  std::unique_ptr<SocketSet> sockets = std::make_unique<SocketSet>();

  ~ProcessHandle() { cleanup(); }
  void cleanup() {
    if (handle != nullptr && pid == ::getpid()) api->easy_cleanup(handle);
    handle = nullptr;
  }
  // Forgets a handle made before a fork (the parent's); true if it did.
  bool forget_if_forked() {
    if (handle == nullptr || pid == ::getpid()) return false;
    handle = nullptr;
    sockets = SocketSet::after_fork(std::move(sockets));
    return true;
  }
};

// The calling thread's handle. Its connections stay open between requests (keep-alive). Per
// thread by design: a libcurl easy handle may be used by one thread at a time.
thread_local ProcessHandle this_thread;

CURL* thread_handle(const CurlApi& api) {
  ProcessHandle& t = this_thread;
  t.forget_if_forked();
  if (t.handle == nullptr) {
    t.handle = api.easy_init();
    t.pid = ::getpid();
    t.api = &api;
  } else {
    api.easy_reset(t.handle);  // options go; the connection cache stays
  }
  track_sockets(api, t.handle, t.sockets.get());
  return t.handle;
}

using base::lower;
using base::trim;

// libcurl's error text for one attempt, without the " after N ms" it puts in some ("Failed to
// connect to host port 80 after 0 ms: ..."): the attempt's time, which read beside ferry's count
// of attempts passed for the time of them all.
std::string curl_words(std::string text) {
  for (std::size_t at = text.find(" after "); at != std::string::npos;
       at = text.find(" after ", at + 1)) {
    std::size_t end = at + 7;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    if (end > at + 7 && text.compare(end, 3, " ms") == 0) {
      text.erase(at, end + 3 - at);
      break;
    }
  }
  return text;
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
  std::optional<std::uint64_t> length;  // the answer's Content-Length, where it gave one
  std::uint64_t skip = 0;               // a whole-object answer's bytes before the range: discarded
  bool enough = false;  // the range has landed: the rest of a whole-object answer is cut
};

// A header line ("Name: value") of an answer, as both transports read it: Content-Range, ETag,
// Retry-After and Accept-Ranges are kept in `x` and `a`. The name lower-cased and the value
// trimmed, or nothing for a line that is not a header.
std::optional<std::pair<std::string, std::string>> keep_header(std::string_view line, Exchange& x,
                                                               HttpAnswer& a) {
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string name = lower(line.substr(0, colon));
  std::string value(trim(line.substr(colon + 1)));
  if (name == "content-range") x.content_range = value;
  if (name == "etag") a.etag = value;
  if (name == "retry-after") a.retry_after = value;
  if (name == "accept-ranges") a.accept_ranges = lower(value);
  return std::make_pair(std::move(name), std::move(value));
}

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto& x = *static_cast<Exchange*>(user);
  const std::string_view line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {  // a new answer (after a redirect or 100 Continue)
    x.content_range.clear();
    x.answer->etag.clear();
    x.answer->retry_after.clear();
    x.answer->accept_ranges.clear();
    return size * n;
  }
  keep_header(line, x, *x.answer);
  return size * n;
}

// `s` as a decimal number of at most 19 digits (no sign, no space); false when it is not one.
bool decimal(std::string_view s, std::uint64_t* out) {
  if (s.empty() || s.size() > 19) return false;
  std::uint64_t x = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    x = x * 10 + static_cast<std::uint64_t>(c - '0');
  }
  *out = x;
  return true;
}

// The If-Match header for `etag`, or nothing: If-Match compares strongly (RFC 9110 13.1.1), so
// a weak ETag (W/"...") would make an RFC-strict server answer 412 to every GET. With a weak one
// no precondition is sent and each answer's ETag is compared with it instead (check_status).
std::string if_match(const std::string& etag) {
  if (etag.empty() || etag.rfind("W/", 0) == 0) return {};
  return "If-Match: " + etag;
}

// Parses "bytes A-B/TOTAL" (or "bytes */TOTAL"); false when it is not that.
bool parse_content_range(std::string_view v, std::uint64_t* a, std::uint64_t* b,
                         std::uint64_t* total) {
  if (v.rfind("bytes ", 0) != 0) return false;
  v.remove_prefix(6);
  const std::size_t slash = v.find('/');
  if (slash == std::string_view::npos) return false;
  if (!decimal(v.substr(slash + 1), total)) return false;
  const std::string_view span = v.substr(0, slash);
  if (span == "*") {
    *a = *b = 0;
    return true;
  }
  const std::size_t dash = span.find('-');
  return dash != std::string_view::npos && decimal(span.substr(0, dash), a) &&
         decimal(span.substr(dash + 1), b);
}

// The first body byte: is this answer of `status` the one asked for? Sets answer->refused when
// not.
void check_status(Exchange& x, long status) {
  x.checked = true;
  HttpAnswer& a = *x.answer;
  a.status = status;
  if (status < 200 || status > 299) {
    x.error_answer = true;
    return;
  }
  if (x.probe) return;
  if (status == 200) {
    // The whole object: the server ignores Range (python3 -m http.server does), or the range was
    // all of it. The range is cut out of the body as it comes, as curl does: the bytes before it
    // are received and discarded, and the transfer ends once it has landed. Only the object seen
    // at open will do: a body of another length is another object. Its ETag is checked below, as
    // a 206's (a server that ignores Range may ignore If-Match too).
    if (x.length && *x.length != x.object_size) {
      a.refused = fmt::format(
          "the server answered 200 (the whole object) with {} B to a request for bytes {}-{}, "
          "but the object was {} B when opened: it changed, so no byte of it is used",
          *x.length, x.offset, x.offset + x.size - 1, x.object_size);
      return;
    }
    x.skip = x.offset;
    a.whole_object = x.offset != 0 || x.size != x.object_size;
  } else if (status != 206) {
    a.refused = fmt::format("the server answered {} to a range request", status);
    return;
  } else {
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
  }
  if (x.etag != nullptr && !x.etag->empty() && !a.etag.empty() && a.etag != *x.etag) {
    a.refused = fmt::format("the object's ETag is now {}, not {}: it changed during the read",
                            a.etag, *x.etag);
  }
}

void check_answer(Exchange& x) {
  long status = 0;
  x.api->easy_getinfo(x.handle, CURLINFO_RESPONSE_CODE, &status);
  curl_off_t length = -1;
  x.api->easy_getinfo(x.handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
  if (length >= 0) x.length = static_cast<std::uint64_t>(length);
  check_status(x, status);
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
  std::size_t from = 0;
  if (x.skip > 0) {  // a whole-object answer's bytes before the range
    from = static_cast<std::size_t>(std::min<std::uint64_t>(x.skip, bytes));
    x.skip -= from;
    a.discarded += from;
    if (from == bytes) return bytes;
  }
  const std::size_t fresh = bytes - from;
  if (a.landed + fresh > x.size) {
    if (a.whole_object) {  // the range is complete: the rest of the object is not wanted
      std::memcpy(x.buffer + a.landed, data + from, x.size - a.landed);
      a.landed = x.size;
      x.enough = true;
      return 0;
    }
    a.refused = fmt::format("the server sent more than the {} B of bytes {}-{}", x.size, x.offset,
                            x.offset + x.size - 1);
    return 0;
  }
  std::memcpy(x.buffer + a.landed, data + from, fresh);
  a.landed += fresh;
  return bytes;
}

using Clock = std::chrono::steady_clock;

// What one request may still wait: each byte at most the stall timeout, all of it until the
// deadline (none where request_seconds is 0).
struct Budget {
  explicit Budget(const Timeouts& t)
      : stall_seconds(t.stall_seconds),
        request_seconds(t.request_seconds),
        deadline(t.request_seconds > 0 ? Clock::now() + std::chrono::seconds(t.request_seconds)
                                       : Clock::time_point::max()) {}
  std::string timeout_words() const { return timeout_words_for(past_deadline); }
  std::string timeout_words_for(bool whole) const {
    return whole ? fmt::format(
                       "the request took more than its deadline of {} s "
                       "(FERRY_REMOTE_DEADLINE or KvikIO's http_timeout)",
                       request_seconds)
                 : fmt::format("no byte for {} s (FERRY_REMOTE_TIMEOUT)", stall_seconds);
  }
  long stall_seconds;
  long request_seconds;
  Clock::time_point deadline;
  bool past_deadline = false;
  bool cancelled = false;  // the request was cancelled while it waited (io::cancel_requested)
};

// libcurl's timers may fire this much before the time asked: a timeout this near the deadline is
// the deadline's.
constexpr auto kTimerSlack = std::chrono::milliseconds(200);

// How often a wait looks at io::cancel_requested(): Ctrl-C in Python cancels a request, and its
// GETs end within this much.
constexpr long long kCancelSliceMs = 50;

// libcurl's progress callback: a nonzero answer aborts the transfer (CURLE_ABORTED_BY_CALLBACK)
// once its request is cancelled. libcurl calls it at least once a second while it waits.
int on_progress(void*, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return io::cancel_requested() ? 1 : 0;
}

// The CA certificates that https answers are verified against, or null for the system's store:
// for s3:// AWS_CA_BUNDLE first (as boto3 and the AWS CLI read it), then CURL_CA_BUNDLE and
// SSL_CERT_FILE for every URL.
const char* ca_bundle(const RemoteTarget& target) {
  for (const char* name : {"AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"}) {
    if (!target.s3 && std::string_view(name) == "AWS_CA_BUNDLE") continue;
    const char* ca = std::getenv(name);
    if (ca != nullptr && *ca != '\0') return ca;
  }
  return nullptr;
}

struct Request {
  const CurlApi& api;
  CURL* handle;
  curl_slist* headers = nullptr;
  char error[CURL_ERROR_SIZE] = {};
  Budget budget;

  Request(const CurlApi& a, const RemoteTarget& target, const Timeouts& timeouts)
      : api(a), handle(thread_handle(a)), budget(timeouts) {
    api.easy_setopt(handle, CURLOPT_URL, target.url.c_str());
    api.easy_setopt(handle, CURLOPT_ERRORBUFFER, error);
    api.easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    api.easy_setopt(handle, CURLOPT_TCP_KEEPALIVE, 1L);
    api.easy_setopt(handle, CURLOPT_TCP_NODELAY, 1L);
    api.easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, timeouts.connect_ms);
    api.easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT, 1L);
    api.easy_setopt(handle, CURLOPT_LOW_SPEED_TIME, timeouts.stall_seconds);
    if (timeouts.request_seconds > 0) {
      api.easy_setopt(handle, CURLOPT_TIMEOUT, timeouts.request_seconds);
    }
    // A signed request's redirects are followed by follow_signed, not by libcurl.
    api.easy_setopt(handle, CURLOPT_FOLLOWLOCATION, target.credentials ? 0L : 1L);
    api.easy_setopt(handle, CURLOPT_MAXREDIRS, 5L);
    api.easy_setopt(handle, CURLOPT_USERAGENT, "ferry");
    api.easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, &on_progress);
    api.easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
    // The largest receive buffer libcurl takes: fewer, larger copies into the destination.
    api.easy_setopt(handle, CURLOPT_BUFFERSIZE, 512L << 10);
#if LIBCURL_VERSION_NUM >= 0x075500
    api.easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
    api.easy_setopt(handle, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#endif
    if (const char* ca = ca_bundle(target)) api.easy_setopt(handle, CURLOPT_CAINFO, ca);
    if (target.credentials) {
      const std::string sigv4 = fmt::format("aws:amz:{}:s3", target.region);
      api.easy_setopt(handle, CURLOPT_AWS_SIGV4, sigv4.c_str());
      api.easy_setopt(handle, CURLOPT_USERNAME, target.credentials->access_key.c_str());
      api.easy_setopt(handle, CURLOPT_PASSWORD, target.credentials->secret_key.c_str());
      // libcurl 7.88 adds no x-amz-content-sha256 itself, and S3 wants one; sending the hash it
      // signed keeps the two in agreement whichever way a libcurl version treats the header.
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
    CURLcode rc;
    {
      const Watched watch(this_thread.sockets.get());
      rc = api.easy_perform(handle);
    }
    long connects = 0;
    api.easy_getinfo(handle, CURLINFO_NUM_CONNECTS, &connects);
    a.new_connections = connects;
    if (a.status == 0) api.easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &a.status);
    if (a.status >= 300 && a.status <= 399) {
      // Only where libcurl does not follow (a signed request): where it would have gone.
      const char* location = nullptr;
      api.easy_getinfo(handle, CURLINFO_REDIRECT_URL, &location);
      if (location != nullptr) a.location = location;
    }
    if (rc == CURLE_OK ||
        (rc == CURLE_WRITE_ERROR && (!a.refused.empty() || x.probe_stopped || x.enough))) {
      a.transport_ok = true;
      return;
    }
    a.curl_code = static_cast<int>(rc);
    a.transport_error = error[0] != '\0'
                            ? fmt::format("{} ({})", api.easy_strerror(rc), curl_words(error))
                            : std::string(api.easy_strerror(rc));
    if (rc == CURLE_OPERATION_TIMEDOUT) {
      // libcurl's words say how long, not which bound: the deadline where it has passed.
      a.transport_error =
          fmt::format("{} ({})", api.easy_strerror(rc),
                      budget.timeout_words_for(Clock::now() + kTimerSlack >= budget.deadline));
    }
  }
};

// ---- Ranged GETs straight into the destination ----
// libcurl's write callback hands over bytes it has already received into its own buffer, so a
// GET through it costs two copies: the kernel's into that buffer, then ours into the
// destination. On the H200's loopback that second copy held ferry's host rate at 0.69x parallel
// curl to nowhere (bench/NOTES.md §24). So ferry lets libcurl connect (TCP, TLS, certificates:
// CURLOPT_CONNECT_ONLY), writes the request itself (signed by sigv4.h where it has credentials),
// reads the answer's head, and has curl_easy_recv put the body where it belongs: one copy. What
// this path does not handle (a redirect, a chunked or unsized body, a head over 64 KiB, a URL
// with user:password) goes through libcurl's own transfer instead; so does everything from the
// start where a proxy is in the environment, or where a signed request finds no libcrypto to
// sign with (direct_path_for).

constexpr std::size_t kHeadMax = 64 << 10;
constexpr long kDirectRecvMax = 10L << 20;  // CURL_MAX_READ_SIZE from libcurl 7.88

bool proxy_in_environment() {
  for (const char* name : {"http_proxy", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

// Whether `target`'s requests try this path first: not through a proxy, and signed only where
// ferry can sign them itself (libcurl's transfer signs what it sends: CURLOPT_AWS_SIGV4).
bool direct_path_for(const RemoteTarget& target) {
  return !proxy_in_environment() && (!target.credentials || can_sign(nullptr));
}

// "http://host:port" (what libcurl connects to), the Host header and the request target
// (path and query) of `url`; false for a URL this path leaves to libcurl.
bool split_url(const std::string& url, std::string* origin, std::string* authority,
               std::string* path) {
  const std::size_t scheme = url.find("://");
  if (scheme == std::string::npos) return false;
  const std::size_t host = scheme + 3;
  const std::size_t end = url.find_first_of("/?#", host);
  const std::string auth =
      url.substr(host, end == std::string::npos ? std::string::npos : end - host);
  if (auth.empty() || auth.find('@') != std::string::npos) return false;
  *authority = auth;
  *origin = url.substr(0, host + auth.size());
  std::string rest = end == std::string::npos ? std::string() : url.substr(end);
  rest = rest.substr(0, rest.find('#'));
  if (rest.empty() || rest.front() == '?') rest = std::string(1, '/') + rest;
  for (char c : rest) {
    // One request line of plain ASCII; a URL with other bytes is libcurl's to encode.
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) return false;
  }
  *path = std::move(rest);
  return true;
}

// The calling thread's connection for this path, to one origin at a time.
struct DirectConnection : ProcessHandle {
  std::string origin;
  curl_socket_t socket = CURL_SOCKET_BAD;
  char error[CURL_ERROR_SIZE] = {};

  void drop() {
    cleanup();  // a child made by fork() forgets its parent's handle, never closes it
    origin.clear();
    socket = CURL_SOCKET_BAD;
  }
  CURLcode connect(const CurlApi& a, const std::string& to, const Timeouts& timeouts,
                   const char* ca) {
    drop();
    api = &a;
    pid = ::getpid();
    handle = a.easy_init();
    if (handle == nullptr) return CURLE_OUT_OF_MEMORY;
    error[0] = '\0';
    const std::string url = to + "/";
    a.easy_setopt(handle, CURLOPT_URL, url.c_str());
    a.easy_setopt(handle, CURLOPT_CONNECT_ONLY, 1L);
    // curl_easy_recv reads at most the buffer size per call (16 KiB by default): the most
    // libcurl takes, so that a body comes in few system calls, each straight into its place.
    if (a.easy_setopt(handle, CURLOPT_BUFFERSIZE, kDirectRecvMax) != CURLE_OK) {
      a.easy_setopt(handle, CURLOPT_BUFFERSIZE, 512L << 10);
    }
    a.easy_setopt(handle, CURLOPT_ERRORBUFFER, error);
    a.easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    a.easy_setopt(handle, CURLOPT_TCP_KEEPALIVE, 1L);
    a.easy_setopt(handle, CURLOPT_TCP_NODELAY, 1L);
    a.easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, timeouts.connect_ms);
    a.easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, &on_progress);
    a.easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
    a.easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
    if (ca != nullptr) a.easy_setopt(handle, CURLOPT_CAINFO, ca);
    track_sockets(a, handle, sockets.get());
    CURLcode rc;
    {
      const Watched watch(sockets.get());
      rc = a.easy_perform(handle);
    }
    if (rc == CURLE_OK) a.easy_getinfo(handle, CURLINFO_ACTIVESOCKET, &socket);
    if (rc != CURLE_OK || socket == CURL_SOCKET_BAD) {
      const CURLcode why = rc == CURLE_OK ? CURLE_COULDNT_CONNECT : rc;
      return why;
    }
    origin = to;
    return CURLE_OK;
  }
  // Waits until the socket is ready for `events`; false after the budget's stall timeout
  // without, or at its deadline.
  bool wait(short events, Budget& budget) const {
    pollfd p{socket, events, 0};
    const Clock::time_point stalled = Clock::now() + std::chrono::seconds(budget.stall_seconds);
    for (;;) {
      const Clock::time_point now = Clock::now();
      const Clock::time_point end = std::min(stalled, budget.deadline);
      if (io::cancel_requested()) {
        budget.cancelled = true;
        return false;
      }
      if (now >= end) {
        budget.past_deadline = now >= budget.deadline;
        return false;
      }
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(end - now).count();
      const int n = ::poll(&p, 1, static_cast<int>(std::min<long long>(ms, kCancelSliceMs)));
      if (n > 0) return true;
      if (n < 0 && errno != EINTR) return true;  // the next call says what is wrong
    }
  }
  static CURLcode timed_out(const Budget& budget) {
    return budget.cancelled ? CURLE_ABORTED_BY_CALLBACK : CURLE_OPERATION_TIMEDOUT;
  }
  CURLcode send_all(std::string_view bytes, Budget& budget) {
    while (!bytes.empty()) {
      std::size_t sent = 0;
      const CURLcode rc = api->easy_send(handle, bytes.data(), bytes.size(), &sent);
      if (rc == CURLE_AGAIN) {
        if (!wait(POLLOUT, budget)) return timed_out(budget);
        continue;
      }
      if (rc != CURLE_OK) return rc;
      bytes.remove_prefix(sent);
    }
    return CURLE_OK;
  }
  // Up to `size` bytes into `into`; *n == 0 with CURLE_OK: the server closed the connection.
  CURLcode recv_some(char* into, std::size_t size, std::size_t* n, Budget& budget) {
    for (;;) {
      const CURLcode rc = api->easy_recv(handle, into, size, n);
      if (rc != CURLE_AGAIN) return rc;
      if (!wait(POLLIN, budget)) return timed_out(budget);
    }
  }
};

// Moves `from`'s connection into `to` (whose own, if any, is closed).
void hand_over(DirectConnection& from, DirectConnection& to) {
  to.drop();
  to.api = from.api;
  to.pid = from.pid;
  to.handle = std::exchange(from.handle, nullptr);
  to.origin = std::exchange(from.origin, {});
  to.socket = std::exchange(from.socket, CURL_SOCKET_BAD);
  std::swap(to.sockets, from.sockets);  // the set the handle reports its sockets to goes with it
  to.api->easy_setopt(to.handle, CURLOPT_ERRORBUFFER, to.error);
}

// Connections that a HEAD leaves for the next GET of its origin, on whichever thread makes it
// (direct_head parks, send_and_read_head takes before it connects anew): an open and the reads
// after it share one connection, as a single-threaded client's would. A few at most.
class ParkedConnections {
 public:
  void park(DirectConnection& c) {
    auto idle = std::make_unique<DirectConnection>();
    hand_over(c, *idle);
    std::lock_guard lock(mu_);
    if (idle_.size() == kMax) idle_.erase(idle_.begin());  // closed by its destructor
    idle_.push_back(std::move(idle));
  }
  bool take(const std::string& origin, DirectConnection& into) {
    std::unique_ptr<DirectConnection> found;
    {
      std::lock_guard lock(mu_);
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if ((*it)->origin == origin) {
          found = std::move(*it);
          idle_.erase(it);
          break;
        }
      }
    }
    if (!found) return false;
    if (found->pid != ::getpid()) {  // a parent's, inherited by fork(): never closed here
      found->handle = nullptr;
      return false;
    }
    hand_over(*found, into);
    return true;
  }

 private:
  static constexpr std::size_t kMax = 8;
  std::mutex mu_;
  std::vector<std::unique_ptr<DirectConnection>> idle_;
};

ParkedConnections& parked_connections() {
  // Process-wide: a connection a thread gave back serves any thread's next GET. Never destroyed:
  // threads may outlive statics.
  static auto* parked = new ParkedConnections;
  return *parked;
}

struct Head {
  long status = 0;
  std::optional<std::uint64_t> content_length;
  bool chunked_or_encoded = false;  // Transfer-Encoding: libcurl's transfer reads that
  bool close = false;               // Connection: close
  std::string location;             // a redirect's Location
};

// Parses the head in `text` (through its blank line) into `head`, `x` and `a`; false where it
// is not an HTTP/1.x head.
bool parse_head(std::string_view text, Head* head, Exchange& x, HttpAnswer& a) {
  const std::size_t line_end = text.find("\r\n");
  const std::string_view status_line = text.substr(0, line_end);
  if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12) return false;
  long status = 0;
  for (char c : status_line.substr(9, 3)) {
    if (c < '0' || c > '9') return false;
    status = status * 10 + (c - '0');
  }
  head->status = status;
  // HTTP/1.0 (python3 -m http.server) closes the connection after each answer.
  head->close = status_line.rfind("HTTP/1.0", 0) == 0;
  x.content_range.clear();
  a.etag.clear();
  a.retry_after.clear();
  std::size_t at = line_end + 2;
  while (at < text.size()) {
    const std::size_t end = text.find("\r\n", at);
    const std::string_view line = text.substr(at, end - at);
    at = end == std::string_view::npos ? text.size() : end + 2;
    const auto header = keep_header(line, x, a);
    if (!header) continue;
    const auto& [name, value] = *header;
    if (name == "transfer-encoding") head->chunked_or_encoded = true;
    if (name == "location") head->location = value;
    if (name == "connection" && lower(value).find("close") != std::string::npos) head->close = true;
    if (name == "content-length") {
      std::uint64_t n = 0;
      if (!decimal(value, &n)) return false;
      head->content_length = n;
    }
  }
  return true;
}

void transport_failure(HttpAnswer& a, const CurlApi& api, CURLcode rc, std::string words) {
  a.transport_ok = false;
  a.curl_code = static_cast<int>(rc);
  a.transport_error = words.empty()
                          ? std::string(api.easy_strerror(rc))
                          : fmt::format("{} ({})", api.easy_strerror(rc), curl_words(words));
}

// The GET through this path, or nothing where libcurl's own transfer must take it.
// How a request on a direct connection went as far as its answer's head.
enum class HeadRead { kOk, kFailed, kLibcurl };

// Sends `request` on `c` (connected to `origin` first where it is not) and reads the answer's
// head into `h`, `x` and `a`, and the body bytes read with it into *early. kFailed: a transport
// failure, in `a`; kLibcurl: an answer this path leaves to libcurl's transfer (a redirect, a
// chunked or unsized body, a head over kHeadMax), the connection dropped.
HeadRead send_and_read_head(DirectConnection& c, const CurlApi& api, const RemoteTarget& target,
                            const Timeouts& timeouts, const std::string& origin,
                            const std::string& request, Budget& budget, Exchange& x, HttpAnswer& a,
                            Head* h, std::string* early) {
  // A kept-alive connection the server has closed meanwhile fails before any byte of an
  // answer: then once more on a new one, as libcurl's own transfer does.
  for (int attempt = 0;; ++attempt) {
    const bool reused = (c.handle != nullptr && c.origin == origin) ||
                        (attempt == 0 && parked_connections().take(origin, c));
    if (!reused) {
      const CURLcode rc = c.connect(api, origin, timeouts, ca_bundle(target));
      if (rc != CURLE_OK) {
        transport_failure(a, api, rc, c.error);
        c.drop();
        return HeadRead::kFailed;
      }
      ++a.new_connections;
    }
    CURLcode rc = c.send_all(request, budget);
    std::string head;
    std::size_t head_end = std::string::npos;
    char chunk[16 << 10];
    while (rc == CURLE_OK && head_end == std::string::npos) {
      std::size_t n = 0;
      rc = c.recv_some(chunk, sizeof chunk, &n, budget);
      if (rc != CURLE_OK) break;
      if (n == 0) {
        rc = head.empty() ? CURLE_GOT_NOTHING : CURLE_RECV_ERROR;
        break;
      }
      head.append(chunk, n);
      head_end = head.find("\r\n\r\n");
      // An interim answer (100 Continue) precedes the real one.
      while (head_end != std::string::npos && head.rfind("HTTP/1.1 1", 0) == 0) {
        head.erase(0, head_end + 4);
        head_end = head.find("\r\n\r\n");
      }
      if (head_end == std::string::npos && head.size() > kHeadMax) {
        c.drop();
        return HeadRead::kLibcurl;
      }
    }
    if (rc != CURLE_OK) {
      c.drop();
      if (reused && head.empty() && rc != CURLE_OPERATION_TIMEDOUT &&
          rc != CURLE_ABORTED_BY_CALLBACK && attempt == 0) {
        continue;
      }
      transport_failure(a, api, rc,
                        rc == CURLE_OPERATION_TIMEDOUT ? budget.timeout_words()
                        : rc == CURLE_GOT_NOTHING      ? "the server closed the connection"
                                                       : "");
      return HeadRead::kFailed;
    }
    if (!parse_head(std::string_view(head).substr(0, head_end + 2), h, x, a) ||
        (h->status >= 300 && h->status <= 399) || h->chunked_or_encoded || !h->content_length) {
      c.drop();
      return HeadRead::kLibcurl;  // a redirect, or a body libcurl's transfer reads
    }
    *early = head.substr(head_end + 4);
    return HeadRead::kOk;
  }
}

// An answer's body on a direct connection: the bytes that came with the head first, then the
// socket's. Takes it in order, into buffers or discarded.
struct BodyReader {
  DirectConnection* c = nullptr;
  std::string carry;  // received, not yet taken
  std::size_t carry_at = 0;
  std::uint64_t left = 0;  // the body's bytes not yet taken (the carry's among them)

  // Takes `n` bytes (n <= left) into `into`, or discards them where `into` is null; *got says
  // how many were taken. CURLE_PARTIAL_FILE where the connection ends first.
  CURLcode take(char* into, std::uint64_t n, Budget& budget, std::uint64_t* got) {
    *got = 0;
    const std::size_t from_carry =
        static_cast<std::size_t>(std::min<std::uint64_t>(n, carry.size() - carry_at));
    if (into != nullptr) std::memcpy(into, carry.data() + carry_at, from_carry);
    carry_at += from_carry;
    *got = from_carry;
    left -= from_carry;
    thread_local std::vector<char> scratch;  // per thread: reused by this thread's bodies
    while (*got < n) {
      std::size_t received = 0;
      std::size_t room = static_cast<std::size_t>(n - *got);
      char* at = nullptr;
      if (into != nullptr) {
        at = into + *got;
      } else {
        scratch.resize(1 << 20);
        at = scratch.data();
        room = std::min(room, scratch.size());
      }
      const CURLcode rc = c->recv_some(at, room, &received, budget);
      if (rc != CURLE_OK) return rc;
      if (received == 0) return CURLE_PARTIAL_FILE;
      *got += received;
      left -= received;
    }
    return CURLE_OK;
  }
};

// The words of a body that stopped short.
std::string ended_words(const Budget& budget, CURLcode rc, std::uint64_t landed, std::size_t size) {
  return rc == CURLE_OPERATION_TIMEDOUT
             ? budget.timeout_words()
             : fmt::format("the connection ended after {} of {} B", landed, size);
}

// A request's head as this path writes it, signed where `target` has credentials; `more` is its
// own header lines (each ending "\r\n").
std::string request_text(std::string_view method, const RemoteTarget& target,
                         const std::string& path, const std::string& authority,
                         const std::string& more) {
  return fmt::format("{} {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: ferry\r\nAccept: */*\r\n{}{}\r\n",
                     method, path, authority, more,
                     target.credentials
                         ? s3_signature_lines(method, authority, path, target, std::time(nullptr))
                         : std::string());
}

// A ranged GET's head.
std::string get_text(const RemoteTarget& target, const std::string& path,
                     const std::string& authority, std::uint64_t first, std::uint64_t last,
                     const std::string& etag) {
  const std::string precondition = if_match(etag);
  return request_text("GET", target, path, authority,
                      fmt::format("Range: bytes={}-{}\r\n{}", first, last,
                                  precondition.empty() ? std::string() : precondition + "\r\n"));
}

// Reads an error answer's body (small enough to read whole) into a.body for the server's words
// (S3's Code and Message).
void read_error_body(BodyReader& body, const Head& h, Budget& budget, HttpAnswer& a) {
  const std::uint64_t length = *h.content_length;
  if (length > kHeadMax) {
    body.c->drop();
    return;
  }
  std::string text(static_cast<std::size_t>(length), '\0');
  std::uint64_t got = 0;
  const CURLcode rc = body.take(text.data(), length, budget, &got);
  text.resize(static_cast<std::size_t>(got));
  a.body = text.substr(0, kErrorBodyMax);
  if (rc != CURLE_OK || h.close) body.c->drop();
}

// A signed request's redirect, answered as libcurl's transfer answers it (the status and where
// it leads, in a.location) for follow_signed to follow or refuse; false where it is not one, or
// its Location is relative to the path or the scheme (libcurl's to resolve).
bool signed_redirect(const RemoteTarget& target, const Head& h, const std::string& origin,
                     HttpAnswer& a) {
  if (!target.credentials || h.status < 300 || h.status > 399 || h.location.empty()) return false;
  if (h.location.front() == '/' && h.location.rfind("//", 0) != 0) {  // not "//host/..."
    a.location = origin + h.location;
  } else if (h.location.find("://") != std::string::npos) {
    a.location = h.location;
  } else {
    return false;
  }
  a.transport_ok = true;
  a.status = h.status;
  return true;
}

// The calling thread's direct connection: its GETs' and its HEADs'.
DirectConnection& thread_connection() {
  thread_local DirectConnection c;  // per thread by design, as `this_thread` above
  c.forget_if_forked();
  return c;
}

// A HEAD on the calling thread's direct connection, which its GETs take after it: an open and
// the reads that follow it on the same thread (a checkpoint's header) share one connection
// instead of opening a second. Nothing where libcurl's transfer must take it (a redirect, a head
// too long to read here).
std::optional<HttpAnswer> direct_head(const CurlApi& api, const RemoteTarget& target,
                                      const Timeouts& timeouts) {
  std::string origin, authority, path;
  if (!split_url(target.url, &origin, &authority, &path)) return std::nullopt;
  DirectConnection& c = thread_connection();
  const std::string request = request_text("HEAD", target, path, authority, {});
  Budget budget(timeouts);
  HttpAnswer a;
  Exchange x;
  x.api = &api;
  x.answer = &a;
  Head h;
  std::string early;
  switch (send_and_read_head(c, api, target, timeouts, origin, request, budget, x, a, &h, &early)) {
    case HeadRead::kFailed:
      return a;
    case HeadRead::kLibcurl:
      // A redirect is libcurl's to follow (a signed one follow_signed's); an answer without
      // Content-Length (or chunked) is the answer: the caller learns the size another way, not
      // from a second HEAD.
      if (signed_redirect(target, h, origin, a)) return a;
      if (h.status == 0 || (h.status >= 300 && h.status <= 399)) return std::nullopt;
      a.transport_ok = true;
      a.status = h.status;
      return a;
    case HeadRead::kOk:
      break;
  }
  // An answer to HEAD has no body: bytes after its head mean the connection cannot be trusted
  // with another request.
  if (h.close || !early.empty()) {
    c.drop();
  } else {
    parked_connections().park(c);
  }
  a.transport_ok = true;
  a.status = h.status;
  a.length = *h.content_length;
  a.length_known = true;
  return a;
}

std::optional<HttpAnswer> direct_get_range(const CurlApi& api, const RemoteTarget& target,
                                           const Timeouts& timeouts, std::uint64_t object_size,
                                           const std::string& etag, char* buffer,
                                           std::uint64_t offset, std::size_t size) {
  std::string origin, authority, path;
  if (!split_url(target.url, &origin, &authority, &path)) return std::nullopt;
  DirectConnection& c = thread_connection();
  const std::string request = get_text(target, path, authority, offset, offset + size - 1, etag);
  Budget budget(timeouts);
  HttpAnswer a;
  Exchange x;
  x.api = &api;
  x.answer = &a;
  x.buffer = buffer;
  x.offset = offset;
  x.size = size;
  x.object_size = object_size;
  x.etag = &etag;
  Head h;
  BodyReader body;
  body.c = &c;
  switch (send_and_read_head(c, api, target, timeouts, origin, request, budget, x, a, &h,
                             &body.carry)) {
    case HeadRead::kFailed:
      return a;
    case HeadRead::kLibcurl:
      if (signed_redirect(target, h, origin, a)) return a;
      return std::nullopt;
    case HeadRead::kOk:
      break;
  }
  body.left = *h.content_length;
  x.length = h.content_length;
  check_status(x, h.status);
  a.transport_ok = true;
  if (x.error_answer) {
    read_error_body(body, h, budget, a);
    return a;
  }
  // A 206's body is the range; a 200's (checked to be the object's length) holds it after x.skip.
  if (a.refused.empty() && !a.whole_object) {
    if (*h.content_length < size) {
      a.refused = fmt::format("the answer held {} B of the {} B of bytes {}-{}", *h.content_length,
                              size, offset, offset + size - 1);
    } else if (*h.content_length > size || body.carry.size() > size) {
      a.refused = fmt::format("the server sent more than the {} B of bytes {}-{}", size, offset,
                              offset + size - 1);
    }
  }
  if (!a.refused.empty()) {
    c.drop();  // the body is not read: the connection cannot serve another request
    return a;
  }
  std::uint64_t got = 0;
  CURLcode rc = CURLE_OK;
  if (x.skip > 0) {
    rc = body.take(nullptr, x.skip, budget, &got);
    a.discarded = got;
  }
  if (rc == CURLE_OK) {
    rc = body.take(buffer, size, budget, &got);
    a.landed = static_cast<std::size_t>(got);
  }
  if (rc != CURLE_OK) {
    c.drop();
    transport_failure(a, api, rc == CURLE_PARTIAL_FILE ? CURLE_PARTIAL_FILE : rc,
                      ended_words(budget, rc, a.landed, size));
    return a;
  }
  // The rest of a whole object is not wanted: the connection is closed rather than drained.
  if (h.close || body.left > 0) c.drop();
  return a;
}

}  // namespace

// ---- ObjectStream ----

struct ObjectStream::State {
  DirectConnection c;
  BodyReader body;
  std::uint64_t position = 0;  // the object's byte that body.take gives next
  long status = 0;             // the open GET's (200 or 206)
  bool open = false;
};

ObjectStream::ObjectStream() : state_(std::make_unique<State>()) {}
ObjectStream::~ObjectStream() = default;

bool ObjectStream::is_open() const { return state_->open; }
std::uint64_t ObjectStream::position() const { return state_->position; }

void ObjectStream::close() {
  state_->c.drop();
  state_->open = false;
}

HttpAnswer ObjectStream::read(const CurlApi& api, const RemoteTarget& target,
                              const Timeouts& timeouts, std::uint64_t object_size,
                              const std::string& etag, char* buffer, std::uint64_t offset,
                              std::size_t size) {
  State& s = *state_;
  if (s.c.forget_if_forked()) s.open = false;
  std::string origin, authority, path;
  if (!direct_path_for(target) || !split_url(target.url, &origin, &authority, &path)) {
    close();
    HttpAnswer a = http_get_range(api, target, timeouts, object_size, etag, buffer, offset, size);
    a.new_get = true;
    return a;
  }
  Budget budget(timeouts);
  HttpAnswer a;
  if (!s.open || s.position > offset) {
    // A new GET from `offset`: a server that ignores Range answers 200 from byte 0.
    s.open = false;
    a.new_get = true;
    Exchange x;
    x.api = &api;
    x.answer = &a;
    x.offset = offset;
    x.size = static_cast<std::size_t>(object_size - offset);
    x.object_size = object_size;
    x.etag = &etag;
    const std::string request = get_text(target, path, authority, offset, object_size - 1, etag);
    Head h;
    s.body = BodyReader();
    s.body.c = &s.c;
    switch (send_and_read_head(s.c, api, target, timeouts, origin, request, budget, x, a, &h,
                               &s.body.carry)) {
      case HeadRead::kFailed:
        return a;
      case HeadRead::kLibcurl: {
        HttpAnswer one =
            http_get_range(api, target, timeouts, object_size, etag, buffer, offset, size);
        one.new_get = true;
        one.new_connections += a.new_connections;
        return one;
      }
      case HeadRead::kOk:
        break;
    }
    s.body.left = *h.content_length;
    x.length = h.content_length;
    check_status(x, h.status);
    a.transport_ok = true;
    if (x.error_answer) {
      read_error_body(s.body, h, budget, a);
      return a;
    }
    if (a.refused.empty() && h.status == 206 && *h.content_length != x.size) {
      a.refused = fmt::format("the answer held {} B of the {} B of bytes {}-{}", *h.content_length,
                              x.size, offset, object_size - 1);
    }
    if (!a.refused.empty()) {
      close();
      return a;
    }
    a.whole_object = h.status == 200 && offset > 0;
    s.position = h.status == 200 ? 0 : offset;
    s.status = h.status;
    s.open = true;
  }
  std::uint64_t got = 0;
  CURLcode rc = CURLE_OK;
  if (s.position < offset) {
    rc = s.body.take(nullptr, offset - s.position, budget, &got);
    a.discarded = got;
    s.position += got;
  }
  if (rc == CURLE_OK) {
    rc = s.body.take(buffer, size, budget, &got);
    a.landed = static_cast<std::size_t>(got);
    s.position += got;
  }
  a.transport_ok = rc == CURLE_OK;
  a.status = s.status;
  if (rc != CURLE_OK) {
    close();
    transport_failure(a, api, rc, ended_words(budget, rc, a.landed, size));
    return a;
  }
  if (s.body.left == 0) close();  // the object's last byte: nothing more to come
  return a;
}

namespace {

HttpAnswer head_once(const CurlApi& api, const RemoteTarget& target, const Timeouts& timeouts,
                     bool probe_range) {
  if (!probe_range && direct_path_for(target)) {
    if (std::optional<HttpAnswer> direct = direct_head(api, target, timeouts)) return *direct;
  }
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
      if (parse_content_range(x.content_range, &first, &last, &total)) {
        a.length = a.total = total;
        a.length_known = true;
      }
    } else if (a.status == 200) {
      // The whole object instead of its first byte: its length is the object's size.
      curl_off_t length = -1;
      api.easy_getinfo(r.handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
      a.length = length < 0 ? 0 : static_cast<std::uint64_t>(length);
      a.length_known = length >= 0;
    }
    if (a.status == 416 && !x.content_range.empty()) a.status = 206;
    return a;
  }
  // No Content-Length (a chunked or compressed HEAD answer): length_known stays false and the
  // caller learns the size another way, never taking it for 0.
  curl_off_t length = -1;
  api.easy_getinfo(r.handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
  a.length = length < 0 ? 0 : static_cast<std::uint64_t>(length);
  a.length_known = length >= 0;
  return a;
}

HttpAnswer get_once(const CurlApi& api, const RemoteTarget& target, const Timeouts& timeouts,
                    std::uint64_t object_size, const std::string& etag, char* buffer,
                    std::uint64_t offset, std::size_t size) {
  if (size > 0 && direct_path_for(target)) {
    if (std::optional<HttpAnswer> direct =
            direct_get_range(api, target, timeouts, object_size, etag, buffer, offset, size)) {
      return *direct;
    }
  }
  HttpAnswer a;
  Request r(api, target, timeouts);
  const std::string range = fmt::format("{}-{}", offset, offset + size - 1);
  api.easy_setopt(r.handle, CURLOPT_RANGE, range.c_str());
  if (const std::string precondition = if_match(etag); !precondition.empty()) r.add(precondition);
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

// "scheme://host:port", lowercase, with the scheme's port where none is given.
std::string origin_of(std::string_view url) {
  const std::size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return {};
  const std::string scheme = lower(url.substr(0, scheme_end));
  std::string_view authority = url.substr(scheme_end + 3);
  authority = authority.substr(0, authority.find_first_of("/?#"));
  if (const std::size_t at = authority.rfind('@'); at != std::string_view::npos) {
    authority.remove_prefix(at + 1);
  }
  std::string host = lower(authority);
  const std::size_t colon = host.rfind(':');
  if (colon == std::string::npos || host.find(']', colon) != std::string::npos) {
    host += scheme == "https" ? ":443" : ":80";
  }
  return scheme + "://" + host;
}

// Runs `once` on `target` and, for a signed request, on the redirects it is answered with.
// libcurl, following a redirect itself, would send every header given to it (x-amz-security-
// token) to wherever it leads; so ferry follows a signed request's redirects here, on the same
// scheme, host and port only (as many as libcurl would: 5), and refuses one that leads off them.
// Unsigned requests carry no credential header: libcurl follows theirs (Request).
template <class Once>
HttpAnswer follow_signed(const RemoteTarget& target, Once&& once) {
  RemoteTarget hop = target;
  for (int redirects = 0;; ++redirects) {
    HttpAnswer a = once(hop);
    if (!hop.credentials || !a.transport_ok || a.location.empty()) return a;
    if (origin_of(a.location) != origin_of(target.url)) {
      a.refused = fmt::format(
          "the server redirected a signed request to {}, another host or scheme: not followed, "
          "since the request's credentials would go with it",
          shown_url(a.location));
      return a;
    }
    if (redirects == 5) {
      a.refused = "more than 5 redirects";
      return a;
    }
    hop.url = a.location;
  }
}

}  // namespace

HttpAnswer http_head(const CurlApi& api, const RemoteTarget& target, const Timeouts& timeouts,
                     bool probe_range) {
  return follow_signed(
      target, [&](const RemoteTarget& t) { return head_once(api, t, timeouts, probe_range); });
}

HttpAnswer http_get_range(const CurlApi& api, const RemoteTarget& target, const Timeouts& timeouts,
                          std::uint64_t object_size, const std::string& etag, char* buffer,
                          std::uint64_t offset, std::size_t size) {
  return follow_signed(target, [&](const RemoteTarget& t) {
    return get_once(api, t, timeouts, object_size, etag, buffer, offset, size);
  });
}

#else

HttpAnswer http_head(const CurlApi&, const RemoteTarget&, const Timeouts&, bool) { return {}; }
HttpAnswer http_get_range(const CurlApi&, const RemoteTarget&, const Timeouts&, std::uint64_t,
                          const std::string&, char*, std::uint64_t, std::size_t) {
  return {};
}

struct ObjectStream::State {};
ObjectStream::ObjectStream() : state_(std::make_unique<State>()) {}
ObjectStream::~ObjectStream() = default;
bool ObjectStream::is_open() const { return false; }
std::uint64_t ObjectStream::position() const { return 0; }
void ObjectStream::close() {}
HttpAnswer ObjectStream::read(const CurlApi&, const RemoteTarget&, const Timeouts&, std::uint64_t,
                              const std::string&, char*, std::uint64_t, std::size_t) {
  return {};
}

#endif

}  // namespace ferry::remote
