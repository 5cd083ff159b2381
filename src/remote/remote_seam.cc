#include "remote/remote_seam.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/variables.h"
#include "ferry/error.h"
#include "ferry/remote.h"
#include "remote/curl_api.h"
#include "remote/http_get.h"
#include "remote/remote_url.h"

namespace ferry::remote {
namespace {

constexpr auto kBackoffBase = std::chrono::milliseconds(100);
constexpr auto kBackoffCap = std::chrono::milliseconds(5000);
constexpr auto kRetryAfterCap = std::chrono::seconds(20);
// GETs kept open at once on one object whose server ignores Range: one per request in flight on
// it (a checkpoint load runs 4 parts at once), each read in order by that request's one worker.
constexpr std::size_t kMaxStreams = 4;

struct Object {
  RemoteTarget target;
  std::uint64_t size = 0;
  std::string etag;
  Timeouts timeouts;
  int retries = 0;                  // the policy's, when opened
  std::vector<int> retry_statuses;  // answers retried (besides resets and stalls)
  std::atomic<std::uint64_t> gets{0};
  std::atomic<std::uint64_t> retried{0};
  std::atomic<std::uint64_t> connections{0};
  std::atomic<std::uint64_t> bytes{0};
  std::atomic<int> windows{0};                  // requests counting now
  std::atomic<std::uint64_t> window_starts{0};  // requests that began counting
  std::mutex why_mu;
  std::map<std::string, std::uint64_t> why;  // under why_mu: retries by cause
  // How the server serves ranges: learnt at open (Accept-Ranges, or the answer to a GET of bytes
  // 0-0 where the open made one), else from the first GET's answer.
  std::atomic<io::RangeSupport::Kind> ranges{io::RangeSupport::Kind::kUnknown};
  std::string range_basis;  // under why_mu: how `ranges` is known
  std::atomic<std::uint64_t> discarded{0};
  struct Stream {
    ObjectStream get;
    bool busy = false;  // under streams_mu: a pread reads from it now
  };
  std::mutex streams_mu;
  std::vector<std::unique_ptr<Stream>> streams;  // under streams_mu

  void note_ranges(io::RangeSupport::Kind kind, std::string basis) {
    std::lock_guard lock(why_mu);
    ranges.store(kind);
    range_basis = std::move(basis);
  }
  // Ends the open GETs no pread is reading (a request's last byte has landed: the rest of each
  // object is not wanted).
  void close_idle_streams() {
    std::lock_guard lock(streams_mu);
    for (auto& s : streams) {
      if (!s->busy) s->get.close();
    }
  }
};

// A stream of `o` for a pread at `offset`, marked busy: the open one that is nearest before it,
// else one to open anew; null where every stream is busy.
Object::Stream* take_stream(Object& o, std::uint64_t offset) {
  std::lock_guard lock(o.streams_mu);
  Object::Stream* best = nullptr;
  for (auto& s : o.streams) {
    if (s->busy || !s->get.is_open() || s->get.position() > offset) continue;
    if (best == nullptr || s->get.position() > best->get.position()) best = s.get();
  }
  if (best == nullptr) {
    for (auto& s : o.streams) {
      if (!s->busy && !s->get.is_open()) best = s.get();
    }
  }
  if (best == nullptr && o.streams.size() < kMaxStreams) {
    best = o.streams.emplace_back(std::make_unique<Object::Stream>()).get();
  }
  if (best == nullptr) {
    for (auto& s : o.streams) {
      if (!s->busy) best = s.get();  // it starts again from `offset`
    }
  }
  if (best != nullptr) best->busy = true;
  return best;
}

// How an answer is met.
struct Verdict {
  enum Kind { kOk, kRetry, kFail } kind = kOk;
  int err = 0;
  std::string words;
};

std::string status_words(const HttpAnswer& a) {
  std::string words = fmt::format("HTTP {}", a.status);
  std::string s3 = s3_error_words(a.body);
  if (!s3.empty()) words += ": " + s3;
  return words;
}

Verdict judge(const HttpAnswer& a, const std::vector<int>& retry_statuses) {
  if (!a.transport_ok) {
    switch (a.curl_code) {
      case 7:   // CURLE_COULDNT_CONNECT
      case 18:  // CURLE_PARTIAL_FILE: the body ended before its length
      case 28:  // CURLE_OPERATION_TIMEDOUT
      case 52:  // CURLE_GOT_NOTHING
      case 55:  // CURLE_SEND_ERROR
      case 56:  // CURLE_RECV_ERROR: connection reset
        return {Verdict::kRetry, EIO, a.transport_error};
      case 6:  // CURLE_COULDNT_RESOLVE_HOST
        return {Verdict::kFail, EHOSTUNREACH, a.transport_error};
      case 42:  // CURLE_ABORTED_BY_CALLBACK: the request was cancelled (io::cancel_requested)
        return {Verdict::kFail, ECANCELED, "cancelled"};
      default:
        return {Verdict::kFail, EIO, a.transport_error};
    }
  }
  if (!a.refused.empty()) return {Verdict::kFail, EIO, a.refused};
  if (a.status >= 200 && a.status <= 299) return {};
  for (int retried : retry_statuses) {
    if (a.status == retried) return {Verdict::kRetry, EIO, status_words(a)};
  }
  switch (a.status) {
    case 412:
      return {Verdict::kFail, ESTALE,
              status_words(a) + " (If-Match): the object changed since it was opened"};
    case 404:
      return {Verdict::kFail, ENOENT, status_words(a)};
    case 401:
    case 403:
      return {Verdict::kFail, EACCES, status_words(a)};
    case 416:
      return {Verdict::kFail, ENXIO, status_words(a) + " (range not satisfiable)"};
    default:
      return {Verdict::kFail, EIO, status_words(a)};
  }
}

std::chrono::milliseconds backoff(int attempt, const std::string& retry_after) {
  int seconds = 0;
  auto [p, ec] =
      std::from_chars(retry_after.data(), retry_after.data() + retry_after.size(), seconds);
  if (ec == std::errc() && p == retry_after.data() + retry_after.size() && seconds > 0) {
    return std::min<std::chrono::milliseconds>(std::chrono::seconds(seconds), kRetryAfterCap);
  }
  // Exponential with full jitter (a random share of the exponential step), so that many workers
  // refused at once do not come back at once.
  // Per thread by design: workers draw without sharing a lock.
  thread_local std::minstd_rand random(static_cast<unsigned>(
      std::chrono::steady_clock::now().time_since_epoch().count() ^ ::gettid()));
  const auto step =
      std::min<std::chrono::milliseconds>(kBackoffBase * (1 << std::min(attempt, 10)), kBackoffCap);
  std::uniform_int_distribution<long> share(step.count() / 2, step.count());
  return std::chrono::milliseconds(share(random));
}

// Sleeps `d`, or less where the calling thread's request is cancelled meanwhile (a Retry-After
// may ask for 20 s; Ctrl-C must not wait for it).
void sleep_unless_cancelled(std::chrono::milliseconds d) {
  const auto end = std::chrono::steady_clock::now() + d;
  for (auto now = std::chrono::steady_clock::now(); now < end && !io::cancel_requested();
       now = std::chrono::steady_clock::now()) {
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(end - now, std::chrono::milliseconds(20)));
  }
}

// The policy an object opened now gets: each field of `policy`, else its variable (ferry's, else
// KvikIO's, which count attempts), else the default (base/variables.h). A variable is read only
// when it is used.
RemotePolicy resolve_policy(RemotePolicy policy) {
  if (!policy.retries) policy.retries = static_cast<int>(base::read_number(base::kRemoteRetries));
  if (!policy.stall_seconds) policy.stall_seconds = base::read_number(base::kRemoteTimeout);
  // KvikIO's http_timeout bounds a whole request (CURLOPT_TIMEOUT), as ferry's deadline does.
  if (!policy.request_seconds) policy.request_seconds = base::read_number(base::kRemoteDeadline);
  if (!policy.retry_statuses) {
    const base::Variable& v = base::kRemoteRetryStatuses;
    policy.retry_statuses = base::parse_http_statuses(base::read(v).value, v.env);
  }
  return policy;
}

// Process-wide, as set_remote_policy() says: one policy for every runtime, as the settings are.
struct PolicyCell {
  std::mutex mu;
  RemotePolicy policy;  // under mu
};
PolicyCell& process_policy() {
  static PolicyCell cell;
  return cell;
}

class Window final : public io::SourceWindow {
 public:
  explicit Window(std::shared_ptr<Object> o)
      : o_(std::move(o)),
        gets_(o_->gets.load()),
        retried_(o_->retried.load()),
        connections_(o_->connections.load()),
        bytes_(o_->bytes.load()),
        discarded_(o_->discarded.load()) {
    shared_ = o_->windows.fetch_add(1) > 0;
    starts_ = o_->window_starts.fetch_add(1) + 1;
    std::lock_guard lock(o_->why_mu);
    why_ = o_->why;
  }
  ~Window() override {
    if (!ended_) o_->windows.fetch_sub(1);
  }
  void end(SourceCounts& out) override {
    ended_ = true;
    if (o_->windows.fetch_sub(1) == 1) o_->close_idle_streams();
    out.remote = true;
    out.url = o_->target.shown;
    out.auth = o_->target.auth;
    out.gets = o_->gets.load() - gets_;
    out.retries = o_->retried.load() - retried_;
    out.connections = o_->connections.load() - connections_;
    out.bytes = o_->bytes.load() - bytes_;
    out.shared_window = shared_ || o_->window_starts.load() != starts_;
    out.range_ignored = o_->ranges.load() == io::RangeSupport::Kind::kIgnored;
    out.discarded = o_->discarded.load() - discarded_;
    std::lock_guard lock(o_->why_mu);
    for (const auto& [cause, n] : o_->why) {
      auto before = why_.find(cause);
      const std::uint64_t grew = n - (before == why_.end() ? 0 : before->second);
      if (grew == 0) continue;
      if (!out.retried.empty()) out.retried += ", ";
      out.retried += fmt::format("{} x{}", cause, grew);
    }
  }

 private:
  std::shared_ptr<Object> o_;
  std::uint64_t gets_, retried_, connections_, bytes_, discarded_;
  bool shared_ = false;
  bool ended_ = false;
  std::uint64_t starts_ = 0;
  std::map<std::string, std::uint64_t> why_;
};

class RemoteObjects final : public io::IoSeam {
 public:
  RemoteObjects() = default;

  int open(const char* path, int flags, mode_t) override {
    const std::string shown = shown_url(path);
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & (O_CREAT | O_TRUNC)) != 0) {
      throw IoError(EROFS, "open", shown, 0, 0, 0,
                    "remote objects are read-only in ferry: open them with mode \"r\"");
    }
    if ((flags & O_DIRECT) != 0) {
      errno = EINVAL;  // no page cache to bypass: OpenFile reports O_DIRECT refused
      return -1;
    }
    std::string why_not;
    const CurlApi* api = curl_api(&why_not);
    if (api == nullptr) {
      throw IoError(ENOTSUP, "open", shown, 0, 0, 0, "remote sources unavailable: " + why_not);
    }
    auto o = std::make_shared<Object>();
    try {
      o->target = resolve_remote(path, [](const char* n) { return std::getenv(n); });
      const RemotePolicy policy = resolve_policy(remote_policy());
      o->retries = *policy.retries;
      o->timeouts.stall_seconds = *policy.stall_seconds;
      o->timeouts.request_seconds = *policy.request_seconds;
      o->retry_statuses = *policy.retry_statuses;
      o->timeouts.connect_ms = std::min<long>(10'000, o->timeouts.stall_seconds * 1000);
    } catch (const IoError&) {
      throw;
    } catch (const SettingError&) {
      throw;
    } catch (const Error& e) {
      throw IoError(EINVAL, "open", shown, 0, 0, 0, e.what());
    }
    // A presigned URL signs one method (GET): its size comes from a GET of its first byte.
    const bool presigned = o->target.auth.rfind("presigned", 0) == 0;
    auto probe = [&] { return http_head(*api, o->target, o->timeouts, true); };
    HttpAnswer a;
    HttpAnswer failed;
    bool probed = presigned;  // `a` answers a GET of bytes 0-0, not a HEAD
    try {
      a = attempt(
          *o, "open", 0, 0, [&] { return http_head(*api, o->target, o->timeouts, presigned); },
          &failed);
    } catch (const IoError& head) {
      // A HEAD's error has no body: where the server refused for good (a 4xx not retried), one
      // GET of the first byte brings its words (S3's Code and Message) and its error replaces
      // the HEAD's; should it succeed (a server that refuses HEAD), it serves. Never after a
      // failure that was retried or could have been: that GET would be one attempt beyond the
      // limit, and could succeed on a status the policy says not to retry.
      const bool refused_for_good = failed.transport_ok && failed.status >= 400 &&
                                    failed.status <= 499 &&
                                    judge(failed, o->retry_statuses).kind == Verdict::kFail;
      if (presigned || !refused_for_good) throw;
      const int retries = std::exchange(o->retries, 0);
      try {
        a = attempt(*o, "open", 0, 0, probe);
        probed = true;
      } catch (const IoError& get) {
        // The GET is asked for the HEAD's failure in words. A server that answered it otherwise
        // changed its answer: the open failed with the first.
        if (get.error_code() != head.error_code()) throw head;
        throw;
      }
      o->retries = retries;
    }
    if (!a.length_known && !presigned) {
      // A HEAD answer without Content-Length (chunked, or a server that leaves it out) says
      // nothing of the size: the Content-Range of a GET of the first byte does.
      a = attempt(*o, "open", 0, 0, probe);
      probed = true;
    }
    if (!a.length_known) {
      throw IoError(EPROTO, "open", shown, 0, 0, 0,
                    "the server did not say the object's size (no Content-Length to HEAD, no "
                    "Content-Range or Content-Length to a GET of bytes 0-0)");
    }
    // The ETag goes back to the server in If-Match: a control character in it (a bare CR or LF)
    // would split that request's head, so such an answer is refused rather than reused.
    for (const char c : a.etag) {
      const auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f) {
        throw IoError(EPROTO, "open", shown, 0, 0, 0,
                      fmt::format("the server's ETag holds a control character (0x{:02x}): "
                                  "refused rather than sent back in If-Match",
                                  static_cast<unsigned>(u)));
      }
    }
    o->size = a.length;
    o->etag = a.etag;
    learn_ranges(*o, a, probed);
    const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(errno, "open", "/dev/null", 0, 0, 0, "a descriptor for " + shown);
    std::unique_lock lock(mu_);
    objects_[fd] = std::move(o);
    return fd;
  }

  ssize_t pread(int fd, void* buf, size_t size, off_t offset) override {
    std::shared_ptr<Object> o = find(fd);
    if (!o) return -1;
    const auto off = static_cast<std::uint64_t>(offset);
    if (size == 0 || off >= o->size) return 0;
    const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(size, o->size - off));
    std::string why_not;
    const CurlApi* api = curl_api(&why_not);
    char* into = static_cast<char*>(buf);
    HttpAnswer a;
    using Kind = io::RangeSupport::Kind;
    if (o->ranges.load() == Kind::kServed) {
      a = attempt(*o, "GET", off, len, [&] {
        return http_get_range(*api, o->target, o->timeouts, o->size, o->etag, into, off, len);
      });
      a.new_get = true;
      if (a.whole_object) {
        // The server said it serves ranges, or was not asked: from now on this object's reads
        // stream in order (the requests already cut in tasks each take their range from a
        // whole-object GET, as this one did).
        o->note_ranges(Kind::kIgnored,
                       fmt::format("it answered a GET of bytes {}-{} with the whole object, "
                                   "status 200",
                                   off, off + len - 1));
      }
    } else {
      // The GET open nearest before `off` goes on; the bytes between are discarded.
      Object::Stream* stream = take_stream(*o, off);
      struct GiveBack {
        Object& o;
        Object::Stream* s;
        ~GiveBack() {
          if (s == nullptr) return;
          std::lock_guard lock(o.streams_mu);
          s->busy = false;
        }
      } give_back{*o, stream};
      a = attempt(*o, "GET", off, len, [&] {
        if (stream != nullptr) {
          return stream->get.read(*api, o->target, o->timeouts, o->size, o->etag, into, off, len);
        }
        HttpAnswer one =
            http_get_range(*api, o->target, o->timeouts, o->size, o->etag, into, off, len);
        one.new_get = true;
        return one;
      });
      // A server that has not said learns it from this GET: a 200 to a Range is the whole object.
      if (a.new_get && o->ranges.load() == Kind::kUnknown && (a.status == 200 || a.status == 206)) {
        const bool whole = a.status == 200;
        o->note_ranges(whole ? Kind::kIgnored : Kind::kServed,
                       fmt::format("it answered a GET from byte {} with {}, status {}", off,
                                   whole ? "the whole object" : "that range", a.status));
      }
    }
    if (a.new_get) o->gets.fetch_add(1, std::memory_order_relaxed);
    o->bytes.fetch_add(len, std::memory_order_relaxed);
    o->discarded.fetch_add(a.discarded, std::memory_order_relaxed);
    return static_cast<ssize_t>(len);
  }

  std::optional<io::RangeSupport> range_support(int fd) override {
    std::shared_ptr<Object> o = find(fd);
    if (!o) return std::nullopt;
    std::lock_guard lock(o->why_mu);
    return io::RangeSupport{o->ranges.load(), o->range_basis};
  }

  ssize_t pwrite(int fd, const void*, size_t, off_t) override {
    errno = find(fd) ? EROFS : EBADF;
    return -1;
  }

  int fstat(int fd, struct stat* st) override {
    std::shared_ptr<Object> o = find(fd);
    if (!o) return -1;
    *st = {};
    st->st_mode = S_IFREG | 0444;
    st->st_size = static_cast<off_t>(o->size);
    st->st_nlink = 1;
    st->st_blksize = 4 << 20;
    return 0;
  }

  int fsync(int fd) override { return find(fd) ? 0 : -1; }

  int close(int fd) override {
    {
      std::unique_lock lock(mu_);
      if (objects_.erase(fd) == 0) {
        errno = EBADF;
        return -1;
      }
    }
    return ::close(fd);
  }

  std::unique_ptr<io::SourceWindow> observe_source(int fd) override {
    std::shared_ptr<Object> o = find(fd);
    if (!o) return nullptr;
    return std::make_unique<Window>(std::move(o));
  }

 private:
  std::shared_ptr<Object> find(int fd) {
    std::shared_lock lock(mu_);
    auto it = objects_.find(fd);
    if (it == objects_.end()) {
      errno = EBADF;
      return nullptr;
    }
    return it->second;
  }

  // Whether the server serves ranges decides how a read is cut: one that ignores Range answers
  // every ranged GET with the whole object, so a read of it streams in order from one GET
  // rather than make a whole-object GET of each task. Most servers that serve ranges say so in
  // Accept-Ranges; of one that says nothing (python3 -m http.server), the first read's GET
  // tells, that read streaming in order in case. `a` is the open's answer (`probed`: a GET of
  // bytes 0-0).
  static void learn_ranges(Object& o, const HttpAnswer& a, bool probed) {
    using Kind = io::RangeSupport::Kind;
    if (o.size <= 1) {
      o.note_ranges(Kind::kServed,
                    fmt::format("an object of {} B is read whole by one GET", o.size));
    } else if (probed) {
      o.note_ranges(a.status == 200 ? Kind::kIgnored : Kind::kServed,
                    fmt::format("it answered a GET of bytes 0-0 with {}, status {}",
                                a.status == 200 ? "the whole object" : "that range", a.status));
    } else if (a.accept_ranges.find("bytes") != std::string::npos) {
      o.note_ranges(Kind::kServed, "it says so in Accept-Ranges: bytes");
    } else if (a.accept_ranges == "none") {
      o.note_ranges(Kind::kIgnored, "it says Accept-Ranges: none");
    } else {
      // Not asked with a GET of its own: KvikIO's tests count the requests an open makes.
      o.note_ranges(Kind::kUnknown, "its HEAD answer had no Accept-Ranges");
    }
  }

  // Runs `once` until it succeeds, fails for good, or has been retried o.retries times: at most
  // o.retries + 1 requests. Throws the IoError of the last answer, which it leaves in *failed.
  template <class Once>
  HttpAnswer attempt(Object& o, const char* op, std::uint64_t offset, std::size_t size, Once&& once,
                     HttpAnswer* failed = nullptr) {
    const auto start = std::chrono::steady_clock::now();
    auto cancelled = [&](int attempts) {
      return IoError(ECANCELED, op, o.target.shown, offset, size, 0,
                     attempts == 0 ? std::string("cancelled")
                                   : fmt::format("cancelled after {} attempts", attempts));
    };
    for (int n = 0;; ++n) {
      if (io::cancel_requested()) throw cancelled(n);
      HttpAnswer a = once();
      o.connections.fetch_add(static_cast<std::uint64_t>(std::max(0L, a.new_connections)),
                              std::memory_order_relaxed);
      Verdict v = judge(a, o.retry_statuses);
      if (v.kind == Verdict::kOk) return a;
      // A failure under a cancelled request is the cancellation's (its socket shut down under
      // it), not a fault to retry or count.
      if (io::cancel_requested()) throw cancelled(n + 1);
      if (v.kind == Verdict::kRetry && n < o.retries) {
        o.retried.fetch_add(1, std::memory_order_relaxed);
        {
          std::lock_guard lock(o.why_mu);
          ++o.why[a.transport_ok ? fmt::format("HTTP {}", a.status)
                                 : a.transport_error.substr(0, a.transport_error.find(" ("))];
        }
        sleep_unless_cancelled(backoff(n, a.retry_after));
        continue;
      }
      std::string words = v.words;
      if (n > 0) {
        const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
        words += fmt::format(" (after {} attempts in {:.1f} s)", n + 1, took.count());
      }
      if (v.kind == Verdict::kRetry) {
        words +=
            "; FERRY_REMOTE_RETRIES (or ferry::set_remote_policy, or KvikIO's "
            "http_max_attempts) sets how many times a GET is retried";
      }
      if (failed != nullptr) *failed = std::move(a);
      throw IoError(v.err, op, o.target.shown, offset, size, 0, words);
    }
  }

  std::shared_mutex mu_;
  std::unordered_map<int, std::shared_ptr<Object>> objects_;
};

}  // namespace

io::IoSeam& remote_objects() {
  // Process-wide: the default environment's remote seam (default_environment()); its descriptors
  // are placeholders of this process's fd table. Leaked like system_io().
  static RemoteObjects* seam = new RemoteObjects;
  return *seam;
}

}  // namespace ferry::remote

namespace ferry {

void set_remote_policy(const RemotePolicy& policy) {
  // The limits of the variables (base/variables.h), for the fields that replace them.
  auto within = [](const char* field, const std::optional<long>& value, const base::Variable& v) {
    if (value && (*value < v.low || *value > v.high)) {
      throw SettingError(
          field, std::to_string(*value),
          fmt::format("remote policy {}={}: expected {} to {}", field, *value, v.low, v.high));
    }
  };
  within("retries", policy.retries, base::kRemoteRetries);
  within("stall_seconds", policy.stall_seconds, base::kRemoteTimeout);
  within("request_seconds", policy.request_seconds, base::kRemoteDeadline);
  for (int code : policy.retry_statuses.value_or(std::vector<int>{})) {
    if (code < 100 || code > 599) {
      throw SettingError("retry_statuses", std::to_string(code),
                         fmt::format("remote retry status {}: expected 100 to 599", code));
    }
  }
  remote::PolicyCell& cell = remote::process_policy();
  std::lock_guard lock(cell.mu);
  cell.policy = policy;
}

RemotePolicy remote_policy() {
  remote::PolicyCell& cell = remote::process_policy();
  std::lock_guard lock(cell.mu);
  return cell.policy;
}

RemotePolicy effective_remote_policy() { return remote::resolve_policy(remote_policy()); }

}  // namespace ferry
