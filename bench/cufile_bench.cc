// ferry through cuFile against a bare loop of cuFileRead calls with the same task size and
// threads, in one run on one file (issue 3's speed check), and the cost of the route report.
// Needs a GPU, libcufile and a file cuFile can register (on the GPU machine: the udev entry of
// shared/device.md). Prints one JSON object per case and a table of ratios on stderr.
#include <ferry/ferry.h>
#include <fmt/format.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "backends/default_runtime.h"
#include "core/open_file.h"
#include "cuda/cuda_driver.h"
#include "cufile/cufile_file.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_of(const std::function<void()>& body, int repeat) {
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    auto t0 = Clock::now();
    body();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

void report(const std::string& name, std::uint64_t bytes, double s) {
  nlohmann::json j = {{"case", name}, {"bytes", bytes}, {"seconds", s}, {"gbps", bytes / s / 1e9}};
  fmt::print("{}\n", j.dump());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string path = argc > 1 ? argv[1] : "/tmp/ferry-cufile-bench.bin";
  const std::uint64_t size = argc > 2 ? ferry::parse_size(argv[2], "size") : std::uint64_t{2} << 30;
  const int repeat = 3;
  ferry::Settings settings = ferry::settings();
  const std::size_t task = settings.task_size;
  const std::size_t threads = settings.nthreads;

  {
    ferry::Buffer src(ferry::MemoryKind::kHostPageable, 64 << 20);
    std::memset(src.data(), 0x5A, src.size());
    ferry::File out(path, "w");
    for (std::uint64_t off = 0; off < size; off += src.size()) {
      out.write(src.data(), std::min<std::uint64_t>(src.size(), size - off), off);
    }
    out.sync();
  }
  ferry::Buffer gpu(ferry::MemoryKind::kDevice, size, 0);
  // compat_mode=off: where cuFile has only its compatibility path, auto mode would not call it.
  ferry::SettingsOverride to_cufile;
  to_cufile.compat_mode = ferry::CompatMode::kOff;
  ferry::File file(path, "r", {false, to_cufile});
  std::size_t n = file.read(gpu.data(), size, 0);  // opens cuFile, registers the handle
  ferry::RouteReport route = file.last_route();
  fmt::print(stderr, "{}", route.to_text());
  if (n != size || route.cufile_tasks == 0) {
    fmt::print(stderr, "cufile_bench: the read did not go to cuFile; nothing to compare\n");
    return 2;
  }

  // The bare loop: the same file, tasks and threads, cuFileRead and nothing else.
  auto open = std::make_shared<ferry::core::OpenFile>(path, "r", ferry::FileOptions{},
                                                      ferry::backends::default_runtime());
  ferry::cufile::Probe probe = ferry::cufile::probe(*open, settings);
  if (!probe.state) throw std::runtime_error("cuFile probe: " + probe.why_not);
  const auto& lib = probe.state->library();
  auto bare = [&] {
    std::atomic<std::uint64_t> next{0};
    std::atomic<bool> failed{false};
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        ferry::cuda::use_device(0);
        for (;;) {
          std::uint64_t off = next.fetch_add(task);
          if (off >= size) break;
          std::size_t len = std::min<std::uint64_t>(task, size - off);
          ssize_t r = lib.Read(probe.state->handle(), gpu.data(), len, static_cast<off_t>(off),
                               static_cast<off_t>(off));
          if (r != static_cast<ssize_t>(len)) failed.store(true);
        }
      });
    }
    for (auto& t : pool) t.join();
    if (failed) throw std::runtime_error("a bare cuFileRead returned less than asked");
  };

  // Alternate the two so that neither gets a systematically warmer disk.
  double ferry_best = 1e30, bare_best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    bare_best = std::min(bare_best, seconds_of(bare, 1));
    ferry_best = std::min(ferry_best, seconds_of([&] { file.read(gpu.data(), size, 0); }, 1));
  }
  report("ferry_cufile", size, ferry_best);
  report("bare_cufileread_loop", size, bare_best);
  route = file.last_route();

  // ferry's extra work per request (routing, splitting, two cuFile stats snapshots, the
  // report) is all inside ferry's time, so ferry/bare bounds the report's cost from above.
  fmt::print(stderr, "\nsize {} B, task {} B, {} threads; best of {}\n", size, task, threads,
             repeat);
  fmt::print(stderr, "ferry through cuFile   {:8.2f} GB/s\n", size / ferry_best / 1e9);
  fmt::print(stderr, "bare cuFileRead loop   {:8.2f} GB/s\n", size / bare_best / 1e9);
  fmt::print(stderr, "ferry / bare: {:.3f} (target: within 3%)\n", bare_best / ferry_best);
  fmt::print(stderr, "last route: {}\n", route.verdict());
  std::remove(path.c_str());
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "cufile_bench: {}\n", e.what());
  return 1;
}
