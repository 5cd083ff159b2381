// Remote sources (issue 34): one case per process, so that each starts fresh (bench/remote_bench.py
// runs them interleaved and computes the ratios). Every case reads the whole object at --url:
//   ferry_host     ferry::File(url).pread into pageable host memory, default settings
//   ferry_gpu      the same into device memory on GPU 0
//   curl_parallel  --threads libcurl handles (kept alive) taking --task-size ranges in turn,
//                  the bytes thrown away: parallel `curl -r A-B -o /dev/null`, in one process
//   curl_memory    the same, each range copied by the write callback into its place in one
//                  host buffer (untouched before the first request): what a program that
//                  lands the bytes in memory with libcurl gets
//   kvikio_loop    KvikIO's remote design as issue 34 describes it: 4 MiB ranges one after
//                  another, each GET into one pinned bounce buffer, then a copy to the GPU that
//                  is waited for before the next GET
// Prints one JSON object: the first request (for ferry: open + read, in this fresh process),
// then --repeat warm requests (median and best), and the CPU-seconds per GiB of the warm ones.
#include <fcntl.h>
#include <ferry/ferry.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "cuda/cuda_driver.h"
#include "remote/curl_api.h"

namespace {

using ferry::bench::arg;
using ferry::bench::Clock;
using ferry::bench::since;
namespace abi = ferry::cuda::abi;

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

#if FERRY_HAVE_CURL
const ferry::remote::CurlApi& curl() {
  std::string why;
  const ferry::remote::CurlApi* api = ferry::remote::curl_api(&why);
  if (api == nullptr) throw std::runtime_error("libcurl: " + why);
  return *api;
}

struct Sink {
  char* dst = nullptr;  // null: thrown away
  std::size_t got = 0;
  std::size_t cap = 0;
};

std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  Sink& s = *static_cast<Sink*>(user);
  const std::size_t bytes = size * n;
  if (s.dst != nullptr) {
    if (s.got + bytes > s.cap) return 0;
    std::memcpy(s.dst + s.got, data, bytes);
  }
  s.got += bytes;
  return bytes;
}

// One handle, kept alive across its GETs, as curl's own reuse does.
class Getter {
 public:
  explicit Getter(const std::string& url) : api_(curl()), h_(api_.easy_init()) {
    if (h_ == nullptr) throw std::runtime_error("curl_easy_init failed");
    api_.easy_setopt(h_, CURLOPT_URL, url.c_str());
    api_.easy_setopt(h_, CURLOPT_WRITEFUNCTION, &on_body);
    api_.easy_setopt(h_, CURLOPT_BUFFERSIZE, 512L * 1024);
    api_.easy_setopt(h_, CURLOPT_NOSIGNAL, 1L);
  }
  ~Getter() { api_.easy_cleanup(h_); }
  Getter(const Getter&) = delete;
  Getter& operator=(const Getter&) = delete;

  std::size_t get(std::uint64_t offset, std::size_t size, char* dst) {
    Sink sink{dst, 0, size};
    const std::string range = fmt::format("{}-{}", offset, offset + size - 1);
    api_.easy_setopt(h_, CURLOPT_RANGE, range.c_str());
    api_.easy_setopt(h_, CURLOPT_WRITEDATA, &sink);
    const CURLcode rc = api_.easy_perform(h_);
    long status = 0;
    api_.easy_getinfo(h_, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK || status != 206 || sink.got != size) {
      throw std::runtime_error(fmt::format("GET {}: {} status {} ({} of {} B)", range,
                                           api_.easy_strerror(rc), status, sink.got, size));
    }
    return size;
  }

 private:
  const ferry::remote::CurlApi& api_;
  CURL* h_;
};
#endif

struct Case {
  std::function<void()> setup;  // before the clock of the first request (none for ferry)
  std::function<std::size_t()> run;
  std::function<void(nlohmann::json&)> describe;
};

}  // namespace

int main(int argc, char** argv) try {
  const std::string url = arg(argc, argv, "--url", "");
  const std::string which = arg(argc, argv, "--case", "");
  const int repeat = std::stoi(arg(argc, argv, "--repeat", "3"));
  const int threads = std::stoi(arg(argc, argv, "--threads", "0"));
  const std::size_t task = std::stoull(arg(argc, argv, "--task-size", "4194304"));
  if (url.empty() || which.empty()) {
    fmt::print(stderr,
               "usage: ferry_remote_bench --url URL --case ferry_host|ferry_gpu|curl_parallel|"
               "kvikio_loop [--repeat N] [--threads N] [--task-size BYTES] [--size BYTES]\n");
    return 2;
  }

  Case c;
  std::unique_ptr<ferry::File> file;
  std::unique_ptr<ferry::Buffer> buffer;
  std::unique_ptr<char[]> host;
  std::uint64_t size = 0;
  nlohmann::json extra;
#if FERRY_HAVE_CURL
  std::vector<std::unique_ptr<Getter>> getters;  // the curl cases' handles, one per thread
#endif
  char* bounce = nullptr;  // kvikio_loop's pinned bounce buffer
  abi::DevicePtr dst = 0;

  if (which == "ferry_host" || which == "ferry_gpu") {
    const bool gpu = which == "ferry_gpu";
    c.run = [&, gpu] {
      if (!file) {  // the first request opens the object: a HEAD, as every user's first read
        file = std::make_unique<ferry::File>(url, "r");
        size = file->size();
        if (gpu) {
          buffer = std::make_unique<ferry::Buffer>(ferry::MemoryKind::kDevice, size, 0);
        } else {
          host.reset(new char[size]);  // untouched: the first request pays its page faults
        }
      }
      ferry::IoFuture f = file->pread(gpu ? buffer->data() : host.get(), size, 0);
      const std::size_t n = f.get();
      const ferry::RouteReport r = f.route();
      extra["workers"] = r.workers;
      extra["tasks"] = r.tasks;
      extra["gets"] = r.source.gets;
      extra["connections"] = r.source.connections;
      extra["retries"] = r.source.retries;
      extra["verdict"] = r.verdict();
      return n;
    };
  } else {
#if FERRY_HAVE_CURL
    const bool loop = which == "kvikio_loop";
    const bool into_memory = which == "curl_memory";
    if (!loop && !into_memory && which != "curl_parallel") {
      throw std::runtime_error("unknown --case " + which);
    }
    const int n = loop ? 1 : std::max(1, threads);
    const std::size_t piece = loop ? std::size_t{4} << 20 : task;
    c.setup = [&, n, piece, loop, into_memory] {
      // The object's size is given (the driver made the object): no HEAD is timed here.
      size = std::stoull(arg(argc, argv, "--size", "0"));
      if (size == 0) throw std::runtime_error("--size is needed for the curl cases");
      for (int i = 0; i < n; ++i) getters.push_back(std::make_unique<Getter>(url));
      if (into_memory) host.reset(new char[size]);
      if (loop) {
        ferry::cuda::use_device(0);
        const auto& d = ferry::cuda::driver();
        void* p = nullptr;
        ferry::cuda::check(d.MemHostAlloc(&p, piece, abi::kMemHostAllocPortable), "cuMemHostAlloc");
        bounce = static_cast<char*>(p);
        buffer = std::make_unique<ferry::Buffer>(ferry::MemoryKind::kDevice, size, 0);
        dst = reinterpret_cast<abi::DevicePtr>(buffer->data());
      }
    };
    c.run = [&, n, piece, loop] {
      if (loop) {
        const auto& d = ferry::cuda::driver();
        for (std::uint64_t off = 0; off < size; off += piece) {
          const std::size_t len = std::min<std::uint64_t>(piece, size - off);
          getters[0]->get(off, len, bounce);
          ferry::cuda::check(d.MemcpyHtoD(dst + off, bounce, len), "cuMemcpyHtoD");
        }
        return static_cast<std::size_t>(size);
      }
      std::atomic<std::uint64_t> next{0};
      std::vector<std::thread> pool;
      for (int t = 0; t < n; ++t) {
        pool.emplace_back([&, t] {
          for (;;) {
            const std::uint64_t off = next.fetch_add(piece);
            if (off >= size) break;
            getters[t]->get(off, std::min<std::uint64_t>(piece, size - off),
                            host ? host.get() + off : nullptr);
          }
        });
      }
      for (auto& th : pool) th.join();
      return static_cast<std::size_t>(size);
    };
    extra["threads"] = n;
    extra["range_bytes"] = piece;
#else
    throw std::runtime_error("built without curl.h: the curl cases are unavailable");
#endif
  }

  if (c.setup) c.setup();
  const auto t0 = Clock::now();
  const std::size_t first_bytes = c.run();
  const double first = since(t0);
  std::vector<double> warm;
  const double cpu0 = cpu_seconds();
  for (int i = 0; i < repeat; ++i) {
    const auto t = Clock::now();
    if (c.run() != first_bytes) throw std::runtime_error("a short read");
    warm.push_back(since(t));
  }
  const double cpu = cpu_seconds() - cpu0;
  std::vector<double> sorted = warm;
  std::sort(sorted.begin(), sorted.end());
  const double gib = static_cast<double>(first_bytes) / (1u << 30);
  nlohmann::json j = extra;
  j["case"] = which;
  j["bytes"] = first_bytes;
  j["first_s"] = first;
  j["first_gbps"] = static_cast<double>(first_bytes) / first / 1e9;
  if (!sorted.empty()) {
    j["warm_median_gbps"] = static_cast<double>(first_bytes) / sorted[sorted.size() / 2] / 1e9;
    j["warm_best_gbps"] = static_cast<double>(first_bytes) / sorted.front() / 1e9;
    j["cpu_s_per_gib"] = cpu / (gib * static_cast<double>(warm.size()));
  }
  fmt::print("{}\n", j.dump());
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "ferry_remote_bench: {}\n", e.what());
  return 1;
}
