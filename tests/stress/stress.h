// The bounded stress run shared by the host and GPU variants: 16 threads keep 64 requests in
// flight (4 lanes each), mixing reads and writes of random sizes and offsets over several files
// for a fixed count, then every byte of every file is checked. Thread t writes only inside its
// own region of each file, lane l only inside slot l of it, so the expected contents are known
// exactly (a shadow copy) while reads of the read-only file overlap everything. Memory is
// abstracted by `Lane`: host vectors or ferry::Buffer of any kind.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "test_util.h"

namespace ferry::test {

struct StressConfig {
  int threads = 16;
  int lanes = 4;                 // requests in flight per thread
  int files = 4;                 // written and read
  std::size_t slot = 128 << 10;  // bytes per lane in each file
  int ops_per_thread = 400;
  const char* task_size = "16KiB";  // small, so requests split into many tasks
  const char* nthreads = "8";
  bool direct = false;
};

// One lane's buffer: where a request's bytes go or come from.
class LaneMemory {
 public:
  virtual ~LaneMemory() = default;
  virtual void* data() = 0;
  virtual void to_host(void* dst, std::size_t size) = 0;
  virtual void from_host(const void* src, std::size_t size) = 0;
};

using LaneFactory = std::function<std::unique_ptr<LaneMemory>(std::size_t size)>;

struct StressResult {
  std::uint64_t requests = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
  std::string first_error;
  std::uint64_t errors = 0;
};

inline StressResult run_stress(const StressConfig& c, const std::filesystem::path& dir,
                               const LaneFactory& make_lane) {
  const std::size_t region = c.slot * static_cast<std::size_t>(c.lanes);
  const std::size_t file_size = region * static_cast<std::size_t>(c.threads);
  // Shadow copies: what each written file must hold; file `c.files` is read-only.
  std::vector<std::vector<unsigned char>> shadow;
  std::vector<std::filesystem::path> paths;
  for (int i = 0; i <= c.files; ++i) {
    shadow.push_back(pattern_bytes(file_size, 100 + static_cast<std::uint64_t>(i)));
    paths.push_back(dir / ("stress-" + std::to_string(i) + ".bin"));
    write_file(paths.back(), shadow.back());
  }
  FileOptions options;
  options.direct = c.direct;
  options.settings.set("task_size", c.task_size);
  options.settings.set("nthreads", c.nthreads);
  std::vector<File> files;
  for (int i = 0; i < c.files; ++i) files.emplace_back(paths[i], "r+", options);
  File readonly(paths[c.files], "r", options);

  StressResult result;
  std::mutex mu;
  std::atomic<std::uint64_t> requests{0}, bytes{0};
  auto error = [&](const std::string& what) {
    std::lock_guard lock(mu);
    if (result.errors++ == 0) result.first_error = what;
  };
  auto start = std::chrono::steady_clock::now();
  auto worker = [&](int t) {
    std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(t));
    struct Pending {
      IoFuture future;
      bool read = false;
      const unsigned char* expect = nullptr;  // for reads: the bytes that must arrive
      std::size_t size = 0;
    };
    std::vector<std::unique_ptr<LaneMemory>> mem;
    std::vector<std::optional<Pending>> lanes(static_cast<std::size_t>(c.lanes));
    for (int l = 0; l < c.lanes; ++l) mem.push_back(make_lane(c.slot));
    std::vector<unsigned char> host(c.slot);
    auto finish = [&](std::size_t l) {
      if (!lanes[l]) return;
      Pending& p = *lanes[l];
      try {
        std::size_t n = p.future.get();
        if (n != p.size)
          error("short request: " + std::to_string(n) + " of " + std::to_string(p.size));
        if (p.read) {
          mem[l]->to_host(host.data(), p.size);
          if (std::memcmp(host.data(), p.expect, p.size) != 0) error("read returned wrong bytes");
        }
        bytes += n;
      } catch (const std::exception& e) {
        error(e.what());
      }
      lanes[l].reset();
    };
    std::vector<unsigned char> fresh(c.slot);
    for (int op = 0; op < c.ops_per_thread; ++op) {
      const std::size_t l = static_cast<std::size_t>(op % c.lanes);
      finish(l);  // a lane holds one request at a time, so its slot's contents are known
      // Sizes from 1 byte to the whole slot, skewed small; offsets unaligned.
      std::size_t size = 1 + rng() % (rng() % 4 == 0 ? c.slot : 4096 + rng() % 16384);
      size = std::min(size, c.slot);
      const std::size_t in_slot = rng() % (c.slot - size + 1);
      const int kind = static_cast<int>(rng() % 10);
      Pending p;
      p.size = size;
      if (kind < 2) {  // anywhere in the read-only file, overlapping every other thread
        const std::size_t off = rng() % (file_size - size + 1);
        p.read = true;
        p.expect = shadow[c.files].data() + off;
        p.future = readonly.pread(mem[l]->data(), size, off);
      } else {
        const int fi = static_cast<int>(rng() % static_cast<std::uint64_t>(c.files));
        const std::size_t off = static_cast<std::size_t>(t) * region + l * c.slot + in_slot;
        unsigned char* target = shadow[fi].data() + off;
        if (kind < 6) {
          p.read = true;
          p.expect = target;
          p.future = files[fi].pread(mem[l]->data(), size, off);
        } else {
          for (std::size_t i = 0; i < size; i += 8) {
            std::uint64_t v = rng();
            std::memcpy(fresh.data() + i, &v, std::min<std::size_t>(8, size - i));
          }
          mem[l]->from_host(fresh.data(), size);
          std::memcpy(target, fresh.data(), size);  // this thread alone writes this slot
          p.future = files[fi].pwrite(mem[l]->data(), size, off);
        }
      }
      lanes[l] = std::move(p);
      ++requests;
    }
    for (std::size_t l = 0; l < lanes.size(); ++l) finish(l);
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < c.threads; ++t) pool.emplace_back(worker, t);
  for (std::thread& th : pool) th.join();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.requests = requests;
  result.bytes = bytes;
  files.clear();
  // Every byte of every file, read back without ferry.
  for (int i = 0; i <= c.files; ++i) {
    if (read_file(paths[i]) != shadow[i]) error("file " + paths[i].string() + " differs");
  }
  return result;
}

inline void report(const char* name, const StressConfig& c, const StressResult& r) {
  std::printf(
      "stress %s: %d threads x %d in flight, %llu requests, %.1f MiB in %.2f s, %llu "
      "error(s)%s%s\n",
      name, c.threads, c.threads * c.lanes, static_cast<unsigned long long>(r.requests),
      static_cast<double>(r.bytes) / (1 << 20), r.seconds,
      static_cast<unsigned long long>(r.errors), r.errors ? ": " : "", r.first_error.c_str());
}

}  // namespace ferry::test
