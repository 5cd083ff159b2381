// The HTTP test server seen through libcurl's easy API: ranges, keep-alive, ETag and If-Match,
// every fault, what it records, and that it survives clients that go away and stops promptly.
#include "http_server.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

// A folder of test objects, removed at the end: a.bin (1000 random bytes), empty (0 bytes),
// "a b.bin" (3 bytes).
class Objects {
 public:
  Objects() {
    std::string pattern = (std::filesystem::temp_directory_path() / "ferry-http-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp " + pattern);
    root_ = pattern;
    std::mt19937 random(7);
    a_.resize(1000);
    for (char& c : a_) c = static_cast<char>(random());
    write("a.bin", a_);
    write("empty", "");
    write("a b.bin", "abc");
  }
  ~Objects() {
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(root_ / name, std::ios::binary) << bytes;
  }
  const std::filesystem::path& root() const { return root_; }
  const std::string& a() const { return a_; }

 private:
  std::filesystem::path root_;
  std::string a_;
};

// What to ask, set in a chain: Options().range("0-9").header("If-Match: \"x\"").
struct Options {
  Options& range(std::string r) { return range_ = std::move(r), *this; }
  Options& header(std::string h) { return headers_.push_back(std::move(h)), *this; }
  Options& head() { return head_ = true, *this; }
  Options& timeout_ms(long ms) { return timeout_ms_ = ms, *this; }
  Options& method(std::string m) { return method_ = std::move(m), *this; }  // e.g. "DELETE"

  std::string range_;
  std::vector<std::string> headers_;
  bool head_ = false;
  long timeout_ms_ = 0;
  std::string method_;
};

struct Reply {
  CURLcode code = CURLE_OK;
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lowercase names, of the last response
};

// One easy handle, so its connection is kept between perform() calls.
class Easy {
 public:
  Easy() : easy_(curl_easy_init()) {}
  ~Easy() { curl_easy_cleanup(easy_); }
  Easy(const Easy&) = delete;
  Easy& operator=(const Easy&) = delete;

  Reply perform(const std::string& url, const Options& options = {}) {
    Reply reply;
    curl_slist* headers = nullptr;
    for (const std::string& h : options.headers_) headers = curl_slist_append(headers, h.c_str());
    curl_easy_setopt(easy_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(easy_, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(easy_, CURLOPT_HTTPGET, 1L);
    curl_easy_setopt(easy_, CURLOPT_NOBODY, options.head_ ? 1L : 0L);
    curl_easy_setopt(easy_, CURLOPT_CUSTOMREQUEST,
                     options.method_.empty() ? nullptr : options.method_.c_str());
    curl_easy_setopt(easy_, CURLOPT_RANGE,
                     options.range_.empty() ? nullptr : options.range_.c_str());
    curl_easy_setopt(easy_, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(easy_, CURLOPT_TIMEOUT_MS, options.timeout_ms_);
    curl_easy_setopt(easy_, CURLOPT_WRITEFUNCTION, &Easy::on_body);
    curl_easy_setopt(easy_, CURLOPT_WRITEDATA, &reply);
    curl_easy_setopt(easy_, CURLOPT_HEADERFUNCTION, &Easy::on_header);
    curl_easy_setopt(easy_, CURLOPT_HEADERDATA, &reply);
    reply.code = curl_easy_perform(easy_);
    curl_easy_getinfo(easy_, CURLINFO_RESPONSE_CODE, &reply.status);
    curl_easy_setopt(easy_, CURLOPT_HTTPHEADER, nullptr);
    curl_slist_free_all(headers);
    return reply;
  }
  CURL* handle() { return easy_; }

 private:
  static size_t on_body(char* data, size_t size, size_t n, void* reply) {
    static_cast<Reply*>(reply)->body.append(data, size * n);
    return size * n;
  }
  static size_t on_header(char* data, size_t size, size_t n, void* user) {
    auto* reply = static_cast<Reply*>(user);
    std::string line(data, size * n);
    if (line.starts_with("HTTP/")) reply->headers.clear();
    std::size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::size_t start = line.find_first_not_of(' ', colon + 1);
      std::size_t end = line.find_last_not_of("\r\n");
      reply->headers[name] = start > end ? "" : line.substr(start, end - start + 1);
    }
    return size * n;
  }

  CURL* easy_;
};

Reply get(const std::string& url, const Options& options = {}) {
  Easy easy;
  return easy.perform(url, options);
}

// A raw connection, for what libcurl will not do: pipelining, hanging up mid-response.
int connect_to(std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  return fd;
}

std::string read_to_end(int fd) {
  std::string all;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) all.append(buf, static_cast<std::size_t>(n));
  return all;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t found = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
    ++found;
  }
  return found;
}

TEST(HttpServer, RangeGetReturnsExactBytes) {
  Objects objects;
  HttpServer server(objects.root());
  Reply reply = get(server.url("a.bin"), Options().range("10-19"));
  EXPECT_EQ(reply.code, CURLE_OK);
  EXPECT_EQ(reply.status, 206);
  EXPECT_EQ(reply.body, objects.a().substr(10, 10));
  EXPECT_EQ(reply.headers["content-range"], "bytes 10-19/1000");
  EXPECT_EQ(reply.headers["content-length"], "10");
  EXPECT_EQ(reply.headers["accept-ranges"], "bytes");
}

TEST(HttpServer, OpenAndSuffixRangesAndRangesPastTheEndAreClipped) {
  Objects objects;
  HttpServer server(objects.root());
  Easy easy;
  Reply open = easy.perform(server.url("a.bin"), Options().range("990-"));
  EXPECT_EQ(open.status, 206);
  EXPECT_EQ(open.body, objects.a().substr(990));
  Reply suffix = easy.perform(server.url("a.bin"), Options().range("-5"));
  EXPECT_EQ(suffix.status, 206);
  EXPECT_EQ(suffix.body, objects.a().substr(995));
  Reply clipped = easy.perform(server.url("a.bin"), Options().range("995-5000"));
  EXPECT_EQ(clipped.status, 206);
  EXPECT_EQ(clipped.headers["content-range"], "bytes 995-999/1000");
  EXPECT_EQ(clipped.body, objects.a().substr(995));
}

TEST(HttpServer, WholeGetHasSizeEtagAndNoContentRange) {
  Objects objects;
  HttpServer server(objects.root());
  Reply reply = get(server.url("a.bin"));
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, objects.a());
  EXPECT_EQ(reply.headers.count("content-range"), 0u);
  EXPECT_EQ(reply.headers["etag"].front(), '"');
  EXPECT_EQ(reply.headers["etag"].back(), '"');
}

TEST(HttpServer, HeadGivesLengthAndEtagWithoutBody) {
  Objects objects;
  HttpServer server(objects.root());
  Reply head = get(server.url("a.bin"), Options().head());
  Reply whole = get(server.url("a.bin"));
  EXPECT_EQ(head.code, CURLE_OK);
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(head.body.empty());
  EXPECT_EQ(head.headers["content-length"], "1000");
  EXPECT_EQ(head.headers["etag"], whole.headers["etag"]);
}

TEST(HttpServer, ZeroByteObjectGives200WithLengthZero) {
  Objects objects;
  HttpServer server(objects.root());
  Reply reply = get(server.url("empty"));
  EXPECT_EQ(reply.code, CURLE_OK);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.headers["content-length"], "0");
  EXPECT_TRUE(reply.body.empty());
  Reply range = get(server.url("empty"), Options().range("0-"));
  EXPECT_EQ(range.status, 416);
  EXPECT_EQ(range.headers["content-range"], "bytes */0");
}

TEST(HttpServer, RangePastTheEndGives416WithTheSize) {
  Objects objects;
  HttpServer server(objects.root());
  Reply reply = get(server.url("a.bin"), Options().range("1000-1099"));
  EXPECT_EQ(reply.code, CURLE_OK);
  EXPECT_EQ(reply.status, 416);
  EXPECT_EQ(reply.headers["content-range"], "bytes */1000");
}

TEST(HttpServer, UnsupportedRangesGive416) {
  Objects objects;
  HttpServer server(objects.root());
  EXPECT_EQ(get(server.url("a.bin"), Options().range("0-1,5-6")).status, 416);
  EXPECT_EQ(get(server.url("a.bin"), Options().range("9-2")).status, 416);
  EXPECT_EQ(get(server.url("a.bin"), Options().header("Range: items=0-1")).status, 416);
}

TEST(HttpServer, KeepAliveServesTenRequestsOnOneConnection) {
  Objects objects;
  HttpServer server(objects.root());
  Easy easy;
  for (int i = 0; i < 10; ++i) {
    Reply reply = easy.perform(server.url("a.bin"), Options().range(std::to_string(i * 100) + "-" +
                                                                    std::to_string(i * 100 + 99)));
    ASSERT_EQ(reply.status, 206);
    EXPECT_EQ(reply.body, objects.a().substr(i * 100, 100));
  }
  EXPECT_EQ(server.requests(), 10u);
  EXPECT_EQ(server.connections(), 1u);
}

TEST(HttpServer, ConnectionCloseIsHonoured) {
  Objects objects;
  HttpServer server(objects.root());
  Easy easy;
  Reply first = easy.perform(server.url("a.bin"), Options().header("Connection: close"));
  EXPECT_EQ(first.headers["connection"], "close");
  easy.perform(server.url("a.bin"));
  EXPECT_EQ(server.connections(), 2u);
}

TEST(HttpServer, PipelinedRequestsAreAnsweredInOrder) {
  Objects objects;
  HttpServer server(objects.root());
  int fd = connect_to(server.port());
  std::string requests =
      "GET /a.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=0-2\r\n\r\n"
      "GET /a%20b.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(::send(fd, requests.data(), requests.size(), 0), ssize_t(requests.size()));
  std::string answers = read_to_end(fd);
  ::close(fd);
  EXPECT_EQ(count(answers, "HTTP/1.1 206"), 1u) << answers;
  EXPECT_EQ(count(answers, "HTTP/1.1 200"), 1u) << answers;
  EXPECT_TRUE(answers.ends_with("\r\n\r\nabc")) << answers;
}

TEST(HttpServer, MissingObjectGives404WithNoSuchKey) {
  Objects objects;
  HttpServer server(objects.root());
  Reply reply = get(server.url("missing.bin"));
  EXPECT_EQ(reply.code, CURLE_OK);
  EXPECT_EQ(reply.status, 404);
  EXPECT_NE(reply.body.find("<Code>NoSuchKey</Code>"), std::string::npos) << reply.body;
  EXPECT_EQ(get(server.url("missing.bin"), Options().head()).status, 404);
}

TEST(HttpServer, DotDotAndFoldersAreNotServed) {
  Objects objects;
  std::filesystem::create_directory(objects.root() / "sub");
  objects.write("sub/x", "x");
  HttpServer server(objects.root() / "sub");
  EXPECT_EQ(get(server.url("x")).body, "x");
  EXPECT_EQ(get(server.url("../a.bin")).status, 404);
  EXPECT_EQ(get(server.url("%2e%2e/a.bin")).status, 404);
  EXPECT_EQ(get(server.url("")).status, 404);
  EXPECT_EQ(get(server.url(".")).status, 404);
}

TEST(HttpServer, OtherMethodsGive405) {
  Objects objects;
  HttpServer server(objects.root());
  Reply reply = get(server.url("a.bin"), Options().method("DELETE"));
  EXPECT_EQ(reply.code, CURLE_OK);
  EXPECT_EQ(reply.status, 405);
  EXPECT_EQ(reply.headers["allow"], "GET, HEAD");
}

TEST(HttpServer, IfMatchMismatchGives412) {
  Objects objects;
  HttpServer server(objects.root());
  std::string etag = get(server.url("a.bin"), Options().head()).headers["etag"];
  EXPECT_EQ(get(server.url("a.bin"), Options().header("If-Match: " + etag)).status, 200);
  Reply other = get(server.url("a.bin"), Options().range("0-9").header("If-Match: \"other\""));
  EXPECT_EQ(other.status, 412);
  EXPECT_NE(other.body.find("PreconditionFailed"), std::string::npos);
}

TEST(HttpServer, EtagSuffixChangesEveryEtag) {
  Objects objects;
  HttpServer server(objects.root());
  std::string etag = get(server.url("a.bin"), Options().head()).headers["etag"];
  server.set_etag_suffix("-v2");
  Reply after = get(server.url("a.bin"), Options().range("0-9").header("If-Match: " + etag));
  EXPECT_EQ(after.status, 412);
  EXPECT_NE(after.headers["etag"], etag);
  EXPECT_NE(after.headers["etag"].find("-v2"), std::string::npos);
}

TEST(HttpServer, FailNextAnswersStatusBodyAndRetryAfterThenRecovers) {
  Objects objects;
  HttpServer server(objects.root());
  std::string slow_down =
      "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";
  server.fail_next(2, 503, slow_down, "1");
  Easy easy;
  EXPECT_EQ(easy.perform(server.url("a.bin"), Options().head()).status, 200);  // HEAD: no fault
  for (int i = 0; i < 2; ++i) {
    Reply reply = easy.perform(server.url("a.bin"), Options().range("0-9"));
    EXPECT_EQ(reply.code, CURLE_OK);
    EXPECT_EQ(reply.status, 503);
    EXPECT_EQ(reply.body, slow_down);
    EXPECT_EQ(reply.headers["retry-after"], "1");
    EXPECT_EQ(reply.headers["content-type"], "application/xml");
  }
  EXPECT_EQ(easy.perform(server.url("a.bin"), Options().range("0-9")).status, 206);
  EXPECT_EQ(server.connections(), 1u);  // an error answer keeps the connection
}

TEST(HttpServer, HeadIsFaultedWhenAsked) {
  Objects objects;
  HttpServer server(objects.root());
  server.fault_head_requests(true);
  server.fail_next(1, 500);
  EXPECT_EQ(get(server.url("a.bin"), Options().head()).status, 500);
  EXPECT_EQ(get(server.url("a.bin")).status, 200);
}

TEST(HttpServer, ResetOnFreshConnectionGivesGotNothing) {
  Objects objects;
  HttpServer server(objects.root());
  server.reset_next(1);
  Reply reply = get(server.url("a.bin"));
  EXPECT_EQ(reply.code, CURLE_GOT_NOTHING) << curl_easy_strerror(reply.code);
  EXPECT_EQ(get(server.url("a.bin")).status, 200);
}

// libcurl resends a request once, on a new connection, when a reused connection closes before
// any byte of the answer: one reset on a kept-alive connection is invisible to its caller.
TEST(HttpServer, ResetOnReusedConnectionIsRetriedOnceByLibcurl) {
  Objects objects;
  HttpServer server(objects.root());
  Easy easy;
  ASSERT_EQ(easy.perform(server.url("a.bin")).status, 200);
  server.reset_next(1);
  Reply once = easy.perform(server.url("a.bin"));
  EXPECT_EQ(once.code, CURLE_OK);
  EXPECT_EQ(server.requests(), 3u);
  EXPECT_EQ(server.connections(), 2u);
  server.reset_next(2);
  Reply twice = easy.perform(server.url("a.bin"));
  EXPECT_EQ(twice.code, CURLE_GOT_NOTHING) << curl_easy_strerror(twice.code);
}

TEST(HttpServer, AbortGivesRecvError) {
  Objects objects;
  HttpServer server(objects.root());
  server.abort_next(1);
  Reply fresh = get(server.url("a.bin"));
  EXPECT_EQ(fresh.code, CURLE_RECV_ERROR) << curl_easy_strerror(fresh.code);
  Easy easy;
  ASSERT_EQ(easy.perform(server.url("a.bin")).status, 200);
  server.abort_next(1);
  Reply reused = easy.perform(server.url("a.bin"));
  EXPECT_EQ(reused.code, CURLE_OK) << curl_easy_strerror(reused.code);  // retried, as a reset
}

TEST(HttpServer, StallDelaysTheAnswer) {
  Objects objects;
  HttpServer server(objects.root());
  server.stall_next(1, 300ms);
  auto start = std::chrono::steady_clock::now();
  Reply reply = get(server.url("a.bin"), Options().range("0-9"));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);
  EXPECT_EQ(reply.status, 206);
}

TEST(HttpServer, StallPastTheTimeoutGivesOperationTimedOut) {
  Objects objects;
  HttpServer server(objects.root());
  server.stall_next(1, 5s);
  Reply reply = get(server.url("a.bin"), Options().timeout_ms(200));
  EXPECT_EQ(reply.code, CURLE_OPERATION_TIMEDOUT) << curl_easy_strerror(reply.code);
  EXPECT_EQ(reply.status, 0);
}

TEST(HttpServer, IgnoreRangeGives200WithTheWholeObject) {
  Objects objects;
  HttpServer server(objects.root());
  server.ignore_range_next(1);
  Reply reply = get(server.url("a.bin"), Options().range("10-19"));
  EXPECT_EQ(reply.code, CURLE_OK);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, objects.a());
  EXPECT_EQ(get(server.url("a.bin"), Options().range("10-19")).status, 206);
}

TEST(HttpServer, WrongRangeShiftsContentRangeByOneByte) {
  Objects objects;
  HttpServer server(objects.root());
  server.wrong_range_next(2);
  Reply middle = get(server.url("a.bin"), Options().range("10-19"));
  EXPECT_EQ(middle.status, 206);
  EXPECT_EQ(middle.headers["content-range"], "bytes 11-20/1000");
  EXPECT_EQ(middle.body, objects.a().substr(11, 10));
  Reply end = get(server.url("a.bin"), Options().range("990-"));
  EXPECT_EQ(end.headers["content-range"], "bytes 989-998/1000");
}

TEST(HttpServer, ShortBodyGivesPartialFile) {
  Objects objects;
  HttpServer server(objects.root());
  server.short_body_next(1);
  Reply reply = get(server.url("a.bin"), Options().range("0-99"));
  EXPECT_EQ(reply.code, CURLE_PARTIAL_FILE) << curl_easy_strerror(reply.code);
  EXPECT_EQ(reply.status, 206);
  EXPECT_EQ(reply.body, objects.a().substr(0, 50));
}

TEST(HttpServer, RecordsRequestLinesAndHeaders) {
  Objects objects;
  HttpServer server(objects.root());
  Easy easy;
  easy.perform(server.url("a.bin"), Options().range("0-99").header("X-Amz-Date: today"));
  easy.perform(server.url("a.bin"), Options().head());
  std::vector<std::string> lines = server.request_lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "GET /a.bin bytes=0-99");
  EXPECT_EQ(lines[1], "HEAD /a.bin -");
  auto headers = server.request_headers();
  EXPECT_EQ(headers[0]["x-amz-date"], "today");
  EXPECT_EQ(headers[0]["host"], "127.0.0.1:" + std::to_string(server.port()));
}

TEST(HttpServer, ClientsHangingUpMidResponseDoNotHurtTheServer) {
  Objects objects;
  std::ofstream(objects.root() / "big.bin") << "";
  std::filesystem::resize_file(objects.root() / "big.bin", 64 << 20);
  HttpServer server(objects.root());
  for (int i = 0; i < 3; ++i) {
    int fd = connect_to(server.port());
    std::string request = "GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(::send(fd, request.data(), request.size(), 0), ssize_t(request.size()));
    char buf[1024];
    ASSERT_GT(::recv(fd, buf, sizeof buf, 0), 0);
    ::close(fd);  // unread bytes: the kernel answers the server with a reset
  }
  Easy easy;
  curl_easy_setopt(easy.handle(), CURLOPT_MAXFILESIZE_LARGE, curl_off_t{1} << 20);
  EXPECT_EQ(easy.perform(server.url("big.bin")).code, CURLE_FILESIZE_EXCEEDED);
  EXPECT_EQ(get(server.url("a.bin")).body, objects.a());
}

TEST(HttpServer, ManyClientsAtOnce) {
  Objects objects;
  HttpServer server(objects.root());
  std::vector<std::thread> clients;
  std::atomic<int> good{0};
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&] {
      Easy easy;
      for (int i = 0; i < 20; ++i) {
        Reply reply = easy.perform(server.url("a.bin"), Options().range("100-199"));
        good += reply.status == 206 && reply.body == objects.a().substr(100, 100);
      }
    });
  }
  for (auto& client : clients) client.join();
  EXPECT_EQ(good, 160);
  EXPECT_EQ(server.requests(), 160u);
  EXPECT_EQ(server.connections(), 8u);
}

TEST(HttpServer, StopsPromptlyDuringAStallAndWithOpenConnections) {
  Objects objects;
  auto server = std::make_unique<HttpServer>(objects.root());
  Easy idle;
  idle.perform(server->url("a.bin"));  // leaves a kept-alive connection open
  server->stall_next(1, 60s);
  CURLcode stalled = CURLE_OK;
  std::thread client([&] { stalled = get(server->url("a.bin")).code; });
  while (server->requests() < 2) std::this_thread::sleep_for(1ms);
  auto start = std::chrono::steady_clock::now();
  server.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  client.join();
  EXPECT_EQ(stalled, CURLE_GOT_NOTHING) << curl_easy_strerror(stalled);
}

TEST(HttpServer, FixedPortInUseThrows) {
  Objects objects;
  HttpServer server(objects.root());
  EXPECT_THROW(HttpServer(objects.root(), server.port()), std::system_error);
  EXPECT_THROW(HttpServer(objects.root() / "a.bin"), std::invalid_argument);
}

}  // namespace
}  // namespace ferry::test
