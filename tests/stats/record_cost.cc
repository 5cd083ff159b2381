// What recording a request costs (bench/NOTES.md §14), in numbers that hold on a loaded machine:
// work in short batches, and report the fastest batch (the one nothing interrupted) and the
// median batch, in nanoseconds per call. Builds against any version of stats_recorder.h.
//   record_cost [batches] [calls]          statistics::record_small_request() alone
//   record_cost read FILE [batches] [calls] 4 KiB File::read() of a page-cached FILE against
//                                           pread(2) of the same offsets, batches interleaved
#include <fcntl.h>
#include <ferry/ferry.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "stats/stats_recorder.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Spread {
  double min = 0;
  double median = 0;
};

Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2]};
}

int record_only(int batches, int calls) {
  std::vector<double> ns(static_cast<std::size_t>(batches));
  for (int w = 0; w < 10000; ++w) {  // warm-up: the first call makes the segment
    ferry::statistics::record_small_request(ferry::Op::kRead, 4096, 1300,
                                            ferry::ReasonCode::kHostBuffer, false);
  }
  for (int b = 0; b < batches; ++b) {
    const auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) {
      ferry::statistics::record_small_request(ferry::Op::kRead, 4096,
                                              1300 + static_cast<unsigned>(i & 7),
                                              ferry::ReasonCode::kHostBuffer, false);
    }
    ns[static_cast<std::size_t>(b)] =
        std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / calls;
  }
  const Spread s = spread(ns);
  std::printf(
      "{\"case\": \"record_small_request\", \"min_ns\": %.2f, \"median_ns\": %.2f, "
      "\"batches\": %d, \"calls\": %d}\n",
      s.min, s.median, batches, calls);
  return 0;
}

int reads(const char* path, int batches, int calls) {
  const int fd = ::open(path, O_RDONLY);
  if (fd < 0) {
    std::perror(path);
    return 1;
  }
  const off_t size = ::lseek(fd, 0, SEEK_END);
  ferry::File file(path);
  std::vector<char> buf(4096);
  std::mt19937_64 rng(7);
  std::vector<off_t> offsets(1 << 16);
  for (off_t& o : offsets)
    o = static_cast<off_t>(rng() % static_cast<std::uint64_t>(size / 4096)) * 4096;
  for (off_t o = 0; o < size; o += 4096) {  // into the page cache
    if (::pread(fd, buf.data(), 4096, o) < 0) return 1;
  }
  std::vector<double> ferry_ns, pread_ns;
  std::size_t k = 0;
  for (int b = 0; b < batches + 20; ++b) {
    auto t0 = Clock::now();
    for (int i = 0; i < calls; ++i) {
      file.read(buf.data(), 4096, static_cast<std::uint64_t>(offsets[k++ & 0xffff]));
    }
    const double f = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / calls;
    t0 = Clock::now();
    for (int i = 0; i < calls; ++i) {
      if (::pread(fd, buf.data(), 4096, offsets[k++ & 0xffff]) != 4096) return 1;
    }
    const double p = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / calls;
    if (b >= 20) {  // after a warm-up
      ferry_ns.push_back(f);
      pread_ns.push_back(p);
    }
  }
  const Spread f = spread(ferry_ns), p = spread(pread_ns);
  std::printf(
      "{\"case\": \"4KiB read\", \"ferry_min_ns\": %.1f, \"ferry_median_ns\": %.1f, "
      "\"pread_min_ns\": %.1f, \"pread_median_ns\": %.1f, \"batches\": %d, "
      "\"calls\": %d}\n",
      f.min, f.median, p.min, p.median, batches, calls);
  ::close(fd);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "read") == 0) {
    return reads(argv[2], argc > 3 ? std::atoi(argv[3]) : 2000,
                 argc > 4 ? std::atoi(argv[4]) : 100);
  }
  return record_only(argc > 1 ? std::atoi(argv[1]) : 2000, argc > 2 ? std::atoi(argv[2]) : 1000);
}
