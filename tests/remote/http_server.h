// ferry::test::HttpServer: a small HTTP/1.1 server on 127.0.0.1 that serves the regular files
// under one folder (HEAD, GET, single byte ranges, ETag, If-Match, keep-alive) for the tests and
// benchmarks of remote sources, with faults to inject (error statuses, resets, stalls, wrong
// ranges, short bodies) and a record of what it was asked. One thread accepts, one thread serves
// each connection. Every member function is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace ferry::test {

class HttpServer {
 public:
  // Serves the regular files under `root` (URL path = percent-decoded path relative to root; a
  // "." or ".." segment is answered 404) on 127.0.0.1:`port`, 0 for a free port chosen by the
  // kernel. Symbolic links under root are followed: whoever made them owns the root. Throws
  // std::system_error naming the call and address when the socket cannot be made or bound, and
  // std::invalid_argument when root is not a folder.
  explicit HttpServer(std::filesystem::path root, std::uint16_t port = 0);
  ~HttpServer();  // stops: closes the listener and every connection, ends stalls, joins threads
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::uint16_t port() const { return port_; }
  std::string url(std::string_view relative) const;  // "http://127.0.0.1:PORT/" + relative

  // Faults, each applied to the next `count` GET requests (and HEAD requests too after
  // fault_head_requests(true)). Faults of different kinds combine: a stall comes first, then a
  // reset or abort, a failure, or a changed answer; a request takes one of each pending kind. A
  // new call of a kind replaces that kind's count. fail_next answers `status` with `body` (e.g.
  // S3's <Error><Code>SlowDown</Code>...</Error>, sent as application/xml when it starts with '<')
  // and, when given, a Retry-After header.
  void fail_next(int count, int status, std::string body = {}, std::string retry_after = {});
  void reset_next(int count);  // reads the request, then closes the connection without answering
  void abort_next(int count);  // reads the request, then aborts the connection with a TCP RST
  void stall_next(int count, std::chrono::milliseconds delay);  // waits before answering
  void ignore_range_next(int count);  // answers 200 with the whole object, ignoring Range
  // Answers 206 with the bytes one past the asked range (one before when the range ends at the
  // object's end), and the Content-Range that says so. A GET without Range counts as 0-(SIZE-1);
  // an object of 0 or 1 byte is served as asked.
  void wrong_range_next(int count);
  void short_body_next(int count);  // sends half the body promised by Content-Length, then closes
  // Sends the body one byte every `interval` (the head at once): a GET that never stalls long.
  void trickle_next(int count, std::chrono::milliseconds interval);
  // Answers 307 with Location: `origin` (as "http://127.0.0.1:PORT") + the request target.
  void redirect_next(int count, std::string origin);
  void ignore_if_match_next(int count);  // serves the object whatever If-Match says
  void fault_head_requests(bool on);     // off at first
  void clear_faults();                   // every count to 0, HEAD requests unfaulted
  // Appended to every object's ETag from now on, as if each object had been replaced.
  void set_etag_suffix(std::string s);
  // From now on ETags are weak (W/"..."), and If-Match compares strongly as RFC 9110 says: a weak
  // ETag never matches, so every GET with If-Match is answered 412.
  void set_weak_etags(bool on);
  // From now on a HEAD answer has no Content-Length (a GET's keeps it).
  void set_head_without_length(bool on);
  // From now on every GET is answered 200 with the whole object, whatever its Range, and no
  // answer says Accept-Ranges: as python3 -m http.server serves files.
  void set_ignore_ranges(bool on);
  // From now on answers carry no ETag (and If-Match holds whatever it says), as python3 -m
  // http.server's.
  void set_without_etags(bool on);

  // What it saw. A request is recorded once its header is read, before it is answered.
  std::size_t requests() const;     // requests read, of any method, faulted or not
  std::size_t connections() const;  // TCP connections accepted
  // "GET /a.bin bytes=0-99": method, request target as sent, the Range header's value or "-".
  std::vector<std::string> request_lines() const;
  std::vector<std::map<std::string, std::string>> request_headers() const;  // lowercase names

 private:
  struct Connection {
    int fd = -1;  // guarded by mutex_; closed and set to -1 by the connection's own thread
    std::thread thread;
    std::atomic<bool> done{false};
  };
  struct Request;
  struct Faults;

  void accept_loop();
  void serve(Connection* connection);
  bool answer(int fd, const Request& request);  // false: close the connection
  bool serve_file(int fd, const Request& request, const Faults& faults);
  Faults take_faults(const std::string& method);
  bool sleep_unless_stopped(std::chrono::milliseconds delay);
  std::string etag_suffix() const;

  std::filesystem::path root_;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // a pipe: the destructor writes, accept_loop's poll wakes
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mutex_;
  std::condition_variable stop_cv_;  // wakes stalls when stopping
  std::list<std::unique_ptr<Connection>> connections_;
  std::size_t connection_count_ = 0;
  std::vector<std::string> request_lines_;
  std::vector<std::map<std::string, std::string>> request_headers_;
  struct FaultCounts {
    int fail = 0, reset = 0, abort = 0, stall = 0, ignore_range = 0, wrong_range = 0;
    int short_body = 0, trickle = 0, redirect = 0, ignore_if_match = 0;
    int fail_status = 500;
    std::string redirect_origin;
    std::chrono::milliseconds trickle_interval{0};
    std::string fail_body, retry_after;
    std::chrono::milliseconds stall_delay{0};
    bool head = false;
  } pending_;
  std::string etag_suffix_;
  bool weak_etags_ = false;
  bool head_without_length_ = false;
  bool ignore_ranges_ = false;
  bool without_etags_ = false;

  std::thread accept_thread_;  // started at the end of the constructor, once all above is set
};

}  // namespace ferry::test
