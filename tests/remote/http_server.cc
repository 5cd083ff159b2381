// The HTTP/1.1 test server: an accept thread, a thread per connection, file bytes sent with
// sendfile(2). Faults are counters taken under the mutex by each GET (or HEAD) when it is read.
#include "http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace ferry::test {
namespace {

constexpr std::size_t kMaxHeaderBytes = 64 * 1024;
constexpr std::size_t kReceiveChunk = 16 * 1024;
constexpr std::size_t kSendfileChunk = std::size_t{1} << 30;
constexpr std::size_t kFallbackChunk = std::size_t{1} << 20;

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// True when the comma-separated list `value` holds `token` (compared without case).
bool has_token(std::string_view value, std::string_view token) {
  std::string list = lowercase(value);
  std::string_view rest = list;
  while (!rest.empty()) {
    std::size_t comma = rest.find(',');
    if (trim(rest.substr(0, comma)) == token) return true;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return false;
}

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

std::string hex(std::uint64_t value) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, 16);
  return std::string(buf, end);
}

const char* reason_phrase(int status) {
  static constexpr std::pair<int, const char*> kPhrases[] = {
      {200, "OK"},
      {206, "Partial Content"},
      {307, "Temporary Redirect"},
      {400, "Bad Request"},
      {403, "Forbidden"},
      {404, "Not Found"},
      {405, "Method Not Allowed"},
      {408, "Request Timeout"},
      {412, "Precondition Failed"},
      {416, "Range Not Satisfiable"},
      {429, "Too Many Requests"},
      {431, "Request Header Fields Too Large"},
      {500, "Internal Server Error"},
      {501, "Not Implemented"},
      {502, "Bad Gateway"},
      {503, "Service Unavailable"},
      {504, "Gateway Timeout"}};
  for (auto [code, phrase] : kPhrases) {
    if (code == status) return phrase;
  }
  return "Status";
}

std::string s3_error(std::string_view code, std::string_view message) {
  return std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>") +
         std::string(code) + "</Code><Message>" + std::string(message) + "</Message></Error>";
}

std::string http_date(std::int64_t seconds) {
  time_t t = static_cast<time_t>(seconds);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[64];
  std::size_t n = strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return std::string(buf, n);
}

// The SIGPIPE that a write to a closed socket raises is blocked in the server's threads (send
// has MSG_NOSIGNAL, sendfile has no such flag): take it so that it does not stay pending.
void drop_pending_sigpipe() {
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  struct timespec zero {};
  while (sigtimedwait(&pipe_set, nullptr, &zero) == SIGPIPE) {
  }
}

bool send_all(int fd, std::string_view data, int flags = 0) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | flags);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// Sends bytes [offset, offset + length) of `file` to the socket: sendfile(2), or pread and send
// where the file's file system cannot sendfile (EINVAL, ENOSYS).
bool send_file_range(int fd, int file, std::uint64_t offset, std::uint64_t length) {
  off_t position = static_cast<off_t>(offset);
  std::uint64_t left = length;
  while (left > 0) {
    ssize_t n = ::sendfile(fd, file, &position, std::min<std::uint64_t>(left, kSendfileChunk));
    if (n > 0) {
      left -= static_cast<std::uint64_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EINVAL || errno == ENOSYS) && left == length) break;
    if (n < 0 && errno == EPIPE) drop_pending_sigpipe();
    return false;  // the client went away, or the file shrank (n == 0)
  }
  std::string buffer(std::min<std::uint64_t>(left, kFallbackChunk), '\0');
  while (left > 0) {
    ssize_t n =
        ::pread(file, buffer.data(), std::min<std::uint64_t>(left, buffer.size()), position);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (!send_all(fd, std::string_view(buffer.data(), static_cast<std::size_t>(n)))) return false;
    position += n;
    left -= static_cast<std::uint64_t>(n);
  }
  return true;
}

// The path under the root that a request target names, percent-decoded; nullopt for a target
// that is not an absolute path, has a bad escape, a NUL, or a "." or ".." segment.
std::optional<std::string> relative_path(std::string_view target) {
  target = target.substr(0, target.find('?'));
  if (target.empty() || target.front() != '/') return std::nullopt;
  std::string decoded;
  for (std::size_t i = 1; i < target.size(); ++i) {
    char c = target[i];
    if (c == '%') {
      unsigned value = 0;
      if (i + 2 >= target.size()) return std::nullopt;
      auto [end, ec] = std::from_chars(target.data() + i + 1, target.data() + i + 3, value, 16);
      if (ec != std::errc() || end != target.data() + i + 3) return std::nullopt;
      c = static_cast<char>(value);
      i += 2;
    }
    if (c == '\0') return std::nullopt;
    decoded += c;
  }
  std::string_view rest = decoded;
  while (true) {
    std::size_t slash = rest.find('/');
    std::string_view segment = rest.substr(0, slash);
    if (segment == "." || segment == "..") return std::nullopt;
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  if (decoded.empty()) return std::nullopt;
  return decoded;
}

// A Range header's single byte range within an object of `size` bytes.
struct ByteRange {
  enum class Kind { kRange, kUnsatisfiable, kUnsupported } kind = Kind::kUnsupported;
  std::uint64_t first = 0, last = 0;
};

ByteRange parse_range(std::string_view value, std::uint64_t size) {
  ByteRange unsupported;
  ByteRange unsatisfiable{ByteRange::Kind::kUnsatisfiable};
  value = trim(value);
  std::size_t equals = value.find('=');
  if (equals == std::string_view::npos || lowercase(trim(value.substr(0, equals))) != "bytes") {
    return unsupported;
  }
  std::string_view spec = trim(value.substr(equals + 1));
  std::size_t dash = spec.find('-');
  if (spec.find(',') != std::string_view::npos || dash == std::string_view::npos) {
    return unsupported;
  }
  std::optional<std::uint64_t> first = parse_u64(trim(spec.substr(0, dash)));
  std::string_view last_text = trim(spec.substr(dash + 1));
  if (!first) {  // "-n": the last n bytes
    std::optional<std::uint64_t> suffix = parse_u64(last_text);
    if (!trim(spec.substr(0, dash)).empty() || !suffix) return unsupported;
    if (*suffix == 0 || size == 0) return unsatisfiable;
    return {ByteRange::Kind::kRange, size - std::min(*suffix, size), size - 1};
  }
  std::optional<std::uint64_t> last =
      last_text.empty() ? std::optional(~std::uint64_t{0}) : parse_u64(last_text);
  if (!last || *last < *first) return unsupported;
  if (*first >= size) return unsatisfiable;
  return {ByteRange::Kind::kRange, *first, std::min(*last, size - 1)};
}

}  // namespace

struct HttpServer::Faults {
  bool fail = false, reset = false, abort = false, ignore_range = false, wrong_range = false;
  bool short_body = false, redirect = false, ignore_if_match = false;
  int fail_status = 0;
  std::string fail_body, retry_after, redirect_origin;
  std::chrono::milliseconds stall{0}, trickle{0};
};

namespace {

struct ParsedRequest {
  std::string method, target;
  std::map<std::string, std::string> headers;  // lowercase names; repeated fields joined
  bool keep_alive = true;

  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

enum class ReadResult { kRequest, kClosed, kTooLarge, kBad };

// Reads one request's header (and discards a GET's or HEAD's Content-Length body) from the
// connection; bytes past it stay in `buffer` for the next, pipelined request.
ReadResult read_request(int fd, std::string& buffer, ParsedRequest& request) {
  auto& [method, target, headers, keep_alive] = request;
  std::size_t end;
  char chunk[kReceiveChunk];
  while (true) {
    while (buffer.starts_with("\r\n")) buffer.erase(0, 2);
    end = buffer.find("\r\n\r\n");
    if (end != std::string::npos) break;
    if (buffer.size() > kMaxHeaderBytes) return ReadResult::kTooLarge;
    ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ReadResult::kClosed;
    buffer.append(chunk, static_cast<std::size_t>(n));
  }
  std::string_view head(buffer.data(), end);
  std::size_t line_end = head.find("\r\n");
  std::string_view line = head.substr(0, line_end);
  std::size_t space1 = line.find(' ');
  std::size_t space2 = line.find(' ', space1 == std::string_view::npos ? 0 : space1 + 1);
  if (space1 == std::string_view::npos || space2 == std::string_view::npos) return ReadResult::kBad;
  method = std::string(line.substr(0, space1));
  target = std::string(line.substr(space1 + 1, space2 - space1 - 1));
  std::string_view version = line.substr(space2 + 1);
  if (!version.starts_with("HTTP/1.") || target.empty()) return ReadResult::kBad;
  while (line_end != std::string_view::npos) {
    head.remove_prefix(line_end + 2);
    line_end = head.find("\r\n");
    line = head.substr(0, line_end);
    std::size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return ReadResult::kBad;
    std::string name = lowercase(line.substr(0, colon));
    std::string value(trim(line.substr(colon + 1)));
    auto [it, added] = headers.emplace(name, value);
    if (!added) it->second += ", " + value;  // repeated fields join as one list
  }
  buffer.erase(0, end + 4);
  auto connection = headers.find("connection");
  std::string connection_value = connection == headers.end() ? "" : connection->second;
  keep_alive = version == "HTTP/1.0" ? has_token(connection_value, "keep-alive")
                                     : !has_token(connection_value, "close");
  if (headers.contains("transfer-encoding")) return ReadResult::kBad;
  auto length = headers.find("content-length");
  if (length != headers.end() && (method == "GET" || method == "HEAD")) {
    std::optional<std::uint64_t> body = parse_u64(length->second);
    if (!body) return ReadResult::kBad;
    std::uint64_t left = *body;
    while (left > buffer.size()) {
      left -= buffer.size();
      buffer.clear();
      ssize_t n = ::recv(fd, chunk, std::min<std::uint64_t>(left, sizeof chunk), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return ReadResult::kClosed;
      buffer.append(chunk, static_cast<std::size_t>(n));
    }
    buffer.erase(0, left);
  }
  return ReadResult::kRequest;
}

// A status line and headers; the blank line that ends them is added here.
std::string response_head(int status, const std::vector<std::string>& fields, bool keep_alive) {
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
  head += "Server: ferry-test\r\n";
  for (const std::string& field : fields) head += field + "\r\n";
  if (!keep_alive) head += "Connection: close\r\n";
  return head + "\r\n";
}

// A whole response with a small body (none for HEAD); false when it could not be sent.
bool send_small(int fd, bool head_only, int status, std::vector<std::string> fields,
                const std::string& body, bool keep_alive) {
  if (!body.empty()) {
    fields.push_back(body.starts_with('<') ? "Content-Type: application/xml"
                                           : "Content-Type: text/plain");
  }
  fields.push_back("Content-Length: " + std::to_string(body.size()));
  std::string response = response_head(status, fields, keep_alive);
  if (!head_only) response += body;
  return send_all(fd, response);
}

}  // namespace

struct HttpServer::Request : ParsedRequest {};

HttpServer::HttpServer(std::filesystem::path root, std::uint16_t port) : root_(std::move(root)) {
  if (!std::filesystem::is_directory(root_)) {
    throw std::invalid_argument("HttpServer root is not a folder: " + root_.string());
  }
  auto fail = [this](const std::string& what) {
    std::system_error error(errno, std::generic_category(), what);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw error;
  };
  std::string address = "127.0.0.1:" + std::to_string(port);
  // Non-blocking: accept_loop's accept must not block when a client that poll reported has
  // gone (then only the wake pipe could end the wait, and it would not be seen).
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) fail("socket for " + address);
  int one = 1;
  if (::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) {
    fail("setsockopt SO_REUSEADDR " + address);
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) fail("bind " + address);
  if (::listen(listen_fd_, SOMAXCONN) != 0) fail("listen " + address);
  socklen_t length = sizeof sa;
  if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &length) != 0) {
    fail("getsockname " + address);
  }
  port_ = ntohs(sa.sin_port);
  if (::pipe2(wake_fds_, O_CLOEXEC) != 0) fail("pipe2 for " + address);
  accept_thread_ = std::thread(&HttpServer::accept_loop, this);
}

HttpServer::~HttpServer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  char byte = 0;
  while (::write(wake_fds_[1], &byte, 1) < 0 && errno == EINTR) {
  }
  accept_thread_.join();
  {
    std::lock_guard lock(mutex_);
    for (auto& connection : connections_) {
      if (connection->fd >= 0) ::shutdown(connection->fd, SHUT_RDWR);
    }
  }
  for (auto& connection : connections_) connection->thread.join();
  ::close(listen_fd_);
  ::close(wake_fds_[0]);
  ::close(wake_fds_[1]);
}

std::string HttpServer::url(std::string_view relative) const {
  if (relative.starts_with('/')) relative.remove_prefix(1);
  return "http://127.0.0.1:" + std::to_string(port_) + "/" + std::string(relative);
}

void HttpServer::fail_next(int count, int status, std::string body, std::string retry_after) {
  std::lock_guard lock(mutex_);
  pending_.fail = count;
  pending_.fail_status = status;
  pending_.fail_body = std::move(body);
  pending_.retry_after = std::move(retry_after);
}

void HttpServer::reset_next(int count) {
  std::lock_guard lock(mutex_);
  pending_.reset = count;
}

void HttpServer::abort_next(int count) {
  std::lock_guard lock(mutex_);
  pending_.abort = count;
}

void HttpServer::stall_next(int count, std::chrono::milliseconds delay) {
  std::lock_guard lock(mutex_);
  pending_.stall = count;
  pending_.stall_delay = delay;
}

void HttpServer::ignore_range_next(int count) {
  std::lock_guard lock(mutex_);
  pending_.ignore_range = count;
}

void HttpServer::wrong_range_next(int count) {
  std::lock_guard lock(mutex_);
  pending_.wrong_range = count;
}

void HttpServer::short_body_next(int count) {
  std::lock_guard lock(mutex_);
  pending_.short_body = count;
}

void HttpServer::trickle_next(int count, std::chrono::milliseconds interval) {
  std::lock_guard lock(mutex_);
  pending_.trickle = count;
  pending_.trickle_interval = interval;
}

void HttpServer::redirect_next(int count, std::string origin) {
  std::lock_guard lock(mutex_);
  pending_.redirect = count;
  pending_.redirect_origin = std::move(origin);
}

void HttpServer::ignore_if_match_next(int count) {
  std::lock_guard lock(mutex_);
  pending_.ignore_if_match = count;
}

void HttpServer::set_weak_etags(bool on) {
  std::lock_guard lock(mutex_);
  weak_etags_ = on;
}

void HttpServer::set_head_without_length(bool on) {
  std::lock_guard lock(mutex_);
  head_without_length_ = on;
}

void HttpServer::set_ignore_ranges(bool on) {
  std::lock_guard lock(mutex_);
  ignore_ranges_ = on;
}

void HttpServer::set_without_etags(bool on) {
  std::lock_guard lock(mutex_);
  without_etags_ = on;
}

void HttpServer::fault_head_requests(bool on) {
  std::lock_guard lock(mutex_);
  pending_.head = on;
}

void HttpServer::clear_faults() {
  std::lock_guard lock(mutex_);
  pending_ = FaultCounts{};
}

void HttpServer::set_etag_suffix(std::string s) {
  std::lock_guard lock(mutex_);
  etag_suffix_ = std::move(s);
}

std::string HttpServer::etag_suffix() const {
  std::lock_guard lock(mutex_);
  return etag_suffix_;
}

std::size_t HttpServer::requests() const {
  std::lock_guard lock(mutex_);
  return request_lines_.size();
}

std::size_t HttpServer::connections() const {
  std::lock_guard lock(mutex_);
  return connection_count_;
}

std::vector<std::string> HttpServer::request_lines() const {
  std::lock_guard lock(mutex_);
  return request_lines_;
}

std::vector<std::map<std::string, std::string>> HttpServer::request_headers() const {
  std::lock_guard lock(mutex_);
  return request_headers_;
}

void HttpServer::accept_loop() {
  // Blocked here, SIGPIPE stays blocked in every connection thread, which inherit this mask.
  sigset_t pipe_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, nullptr);
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fds_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno == EINTR) continue;
    if (stopping_ || fds[1].revents != 0) return;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);  // a blocking socket
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      continue;
    }
    int one = 1;  // small answers and headers go at once, not after the client's delayed ACK
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::list<std::unique_ptr<Connection>> finished;
    {
      std::lock_guard lock(mutex_);
      for (auto it = connections_.begin(); it != connections_.end();) {
        auto next = std::next(it);
        if ((*it)->done) finished.splice(finished.end(), connections_, it);
        it = next;
      }
      ++connection_count_;
      auto connection = std::make_unique<Connection>();
      connection->fd = fd;
      try {
        connection->thread = std::thread(&HttpServer::serve, this, connection.get());
        connections_.push_back(std::move(connection));
      } catch (const std::system_error&) {
        ::close(fd);  // no thread to serve it: the client sees the connection closed
      }
    }
    for (auto& done : finished) done->thread.join();  // they have exited or are exiting
  }
}

void HttpServer::serve(Connection* connection) {
  int fd = connection->fd;  // only this thread changes it
  std::string buffer;
  while (!stopping_) {
    Request request;
    ReadResult read = read_request(fd, buffer, request);
    if (read == ReadResult::kClosed) break;
    if (read == ReadResult::kTooLarge) {
      send_small(fd, false, 431, {}, "", false);
      break;
    }
    if (read == ReadResult::kBad) {
      send_small(fd, false, 400, {}, s3_error("BadRequest", "Malformed request."), false);
      break;
    }
    {
      std::lock_guard lock(mutex_);
      std::string range = request.header("range");
      request_lines_.push_back(request.method + " " + request.target + " " +
                               (range.empty() ? "-" : range));
      request_headers_.push_back(request.headers);
    }
    if (!answer(fd, request)) break;
  }
  std::lock_guard lock(mutex_);
  ::close(fd);
  connection->fd = -1;
  connection->done = true;
}

HttpServer::Faults HttpServer::take_faults(const std::string& method) {
  std::lock_guard lock(mutex_);
  Faults faults;
  if (method == "HEAD" && !pending_.head) return faults;
  auto take = [](int& count) { return count > 0 ? (--count, true) : false; };
  if (take(pending_.stall)) faults.stall = pending_.stall_delay;
  faults.reset = take(pending_.reset);
  faults.abort = take(pending_.abort);
  if ((faults.fail = take(pending_.fail))) {
    faults.fail_status = pending_.fail_status;
    faults.fail_body = pending_.fail_body;
    faults.retry_after = pending_.retry_after;
  }
  faults.ignore_range = take(pending_.ignore_range);
  faults.wrong_range = take(pending_.wrong_range);
  faults.short_body = take(pending_.short_body);
  if (take(pending_.trickle)) faults.trickle = pending_.trickle_interval;
  if ((faults.redirect = take(pending_.redirect)))
    faults.redirect_origin = pending_.redirect_origin;
  faults.ignore_if_match = take(pending_.ignore_if_match);
  return faults;
}

bool HttpServer::sleep_unless_stopped(std::chrono::milliseconds delay) {
  std::unique_lock lock(mutex_);
  return !stop_cv_.wait_for(lock, delay, [this] { return stopping_.load(); });
}

bool HttpServer::answer(int fd, const Request& request) {
  bool head_only = request.method == "HEAD";
  if (request.method != "GET" && !head_only) {
    std::string body =
        s3_error("MethodNotAllowed", "The specified method is not allowed against this resource.");
    send_small(fd, false, 405, {"Allow: GET, HEAD"}, body, false);
    return false;  // its body, if any, was not read
  }
  Faults faults = take_faults(request.method);
  if (faults.stall.count() > 0 && !sleep_unless_stopped(faults.stall)) return false;
  if (faults.reset) return false;
  if (faults.abort) {
    linger abort_on_close{1, 0};  // close() then sends RST, not FIN
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof abort_on_close);
    return false;
  }
  if (faults.redirect) {
    return send_small(fd, head_only, 307, {"Location: " + faults.redirect_origin + request.target},
                      "", request.keep_alive) &&
           request.keep_alive;
  }
  if (faults.fail) {
    std::vector<std::string> fields;
    if (!faults.retry_after.empty()) fields.push_back("Retry-After: " + faults.retry_after);
    return send_small(fd, head_only, faults.fail_status, std::move(fields), faults.fail_body,
                      request.keep_alive) &&
           request.keep_alive;
  }
  return serve_file(fd, request, faults);
}

bool HttpServer::serve_file(int fd, const Request& request, const Faults& faults) {
  bool head_only = request.method == "HEAD";
  bool keep_alive = request.keep_alive;
  std::optional<std::string> relative = relative_path(request.target);
  int file = -1;
  struct stat st {};
  if (relative) {
    std::filesystem::path path = root_ / *relative;
    file = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block
    if (file >= 0 && (::fstat(file, &st) != 0 || !S_ISREG(st.st_mode))) {
      ::close(file);
      file = -1;
    }
  }
  if (file < 0) {
    std::string body = s3_error("NoSuchKey", "The specified key does not exist.");
    return send_small(fd, head_only, 404, {}, body, keep_alive) && keep_alive;
  }
  auto size = static_cast<std::uint64_t>(st.st_size);
  auto mtime_ns = static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1'000'000'000u +
                  static_cast<std::uint64_t>(st.st_mtim.tv_nsec);
  bool weak = false, head_without_length = false, ignore_ranges = false, without_etags = false;
  {
    std::lock_guard lock(mutex_);
    weak = weak_etags_;
    head_without_length = head_without_length_;
    ignore_ranges = ignore_ranges_;
    without_etags = without_etags_;
  }
  std::string etag = "\"" + hex(size) + "-" + hex(mtime_ns) + etag_suffix() + "\"";
  if (weak) etag = "W/" + etag;
  std::vector<std::string> fields = {"Last-Modified: " + http_date(st.st_mtim.tv_sec)};
  if (!without_etags) fields.push_back("ETag: " + etag);
  if (!ignore_ranges) fields.push_back("Accept-Ranges: bytes");

  bool sent = false;
  std::string if_match = request.header("if-match");
  std::string range_value =
      faults.ignore_range || ignore_ranges ? std::string() : request.header("range");
  ByteRange range{ByteRange::Kind::kRange, 0, size == 0 ? 0 : size - 1};
  bool partial = !range_value.empty();
  if (partial) range = parse_range(range_value, size);
  // If-Match compares strongly (RFC 9110 13.1.1): a weak ETag matches nothing.
  const bool if_match_holds = weak ? false : has_token(if_match, etag) || without_etags;
  if (!faults.ignore_if_match && !if_match.empty() && if_match != "*" && !if_match_holds) {
    std::string body = s3_error("PreconditionFailed",
                                "At least one of the pre-conditions you specified did not hold");
    sent = send_small(fd, head_only, 412, std::move(fields), body, keep_alive);
  } else if (range.kind != ByteRange::Kind::kRange) {
    fields.push_back("Content-Range: bytes */" + std::to_string(size));
    std::string body = s3_error("InvalidRange", "The requested range is not satisfiable");
    sent = send_small(fd, head_only, 416, std::move(fields), body, keep_alive);
  } else {
    if (faults.wrong_range && size > 1) {
      partial = true;
      if (range.last + 1 < size) {
        ++range.first, ++range.last;
      } else if (range.first > 0) {
        --range.first, --range.last;
      } else {
        ++range.first;  // the whole object: one byte short, from byte 1
      }
    }
    std::uint64_t length = size == 0 ? 0 : range.last - range.first + 1;
    if (partial) {
      fields.push_back("Content-Range: bytes " + std::to_string(range.first) + "-" +
                       std::to_string(range.last) + "/" + std::to_string(size));
    }
    fields.push_back("Content-Type: application/octet-stream");
    if (!(head_only && head_without_length)) {
      fields.push_back("Content-Length: " + std::to_string(length));
    }
    bool short_body = faults.short_body && !head_only;
    std::string head = response_head(partial ? 206 : 200, fields, keep_alive && !short_body);
    std::uint64_t body = head_only ? 0 : short_body ? length / 2 : length;
    if (faults.trickle.count() > 0 && body > 0) {
      sent = send_all(fd, head);
      for (std::uint64_t i = 0; sent && i < body; ++i) {
        sent =
            sleep_unless_stopped(faults.trickle) && send_file_range(fd, file, range.first + i, 1);
      }
    } else {
      sent = send_all(fd, head, body > 0 ? MSG_MORE : 0) &&
             send_file_range(fd, file, range.first, body) && !short_body;
    }
  }
  ::close(file);
  return sent && keep_alive;
}

}  // namespace ferry::test
