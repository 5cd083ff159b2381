// ferry bench: what a loader gets on this machine. Sequential or random reads or writes of a
// request size, by a number of threads each keeping a number of requests in flight, into memory
// of a kind, by a route; per case GB/s, IOPS, latency percentiles from per-request timings,
// CPU-seconds per GiB and the route report's verdict. --compare runs the same case through a
// plain pread (+ copy) loop in the same run; --ceiling measures the copy rate into that memory.
// Lists of sizes, threads, memories or routes make a sweep: one case (one JSON line) each.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "commands.h"
#include "common.h"
#include "plot.h"
#include "progress.h"

namespace ferry::cli {
namespace {

using Clock = std::chrono::steady_clock;

const char* const kHelpFooter = R"(
Modes, for gdsio users:
  -I 0|1|2|3 is gdsio's -I: read, write, randread, randwrite (the words work too). Sequential
      modes give each thread its own contiguous part of the file; random modes pick aligned
      offsets anywhere in it.
  -x is gdsio's transfer type, mapped to ferry's memory kinds and routes:
      -x 0 GPU_DIRECT       -> --memory gpu:D --route cufile (cuFile; --route gds also refuses
                               cuFile's POSIX compatibility path, as true GDS would)
      -x 1 CPU_ONLY         -> --memory host --route posix
      -x 2 CPU_GPU          -> --memory gpu:D --route posix (pread into pinned staging buffers,
                               then a copy to the GPU: ferry's POSIX path)
      -x 3 CPU_ASYNC_GPU    -> the same as -x 2: ferry's POSIX path already overlaps the copy to
                               the GPU with the next read (two staging buffers per worker)
      -x 4 CPU_CACHED_GPU, 5 GPU_DIRECT_ASYNC, 6 GPU_BATCH, 7 GPU_BATCH_STREAM: no ferry
                               equivalent (ferry calls neither cuFile's stream nor batch API)
      gdsio opens files with O_DIRECT; add --direct to measure the same thing, or --cold to
      read from storage through the page cache.
  -i, -w, -s, -T, -f, -D, -d are gdsio's request size, threads, file size, seconds, file,
      directory and GPU. Long names as in every ferry command: --io-size (the request size;
      --size elsewhere is the bytes of the whole read or write), --jobs (threads issuing
      requests), --threads (ferry's own worker threads, as in ferry read).
Routes: auto (ferry decides and says why), posix (compat mode on: cuFile is never called),
  cufile (compat mode off, require=cufile: cuFile or an error), gds (require=gds).
--depth: requests in flight per thread (IoFuture). Reads and writes of 64 KiB or less into host
  memory complete in the calling thread (a hand-off costs more than they do), so there --depth
  adds nothing: use more --jobs.
Warm or cold: warm reads find the file in the page cache (it is read once first); --cold drops
  its pages with posix_fadvise(DONTNEED) before every run (no root needed) and says how much of
  the file the kernel kept anyway (tmpfs, pages mapped elsewhere), measured page by page.
Latency is per request, from the call to its completion as the thread sees it (in order).
Output: a table on a terminal, one JSON object per case with --json. --plot FILE.png draws
  them (ferry and its baseline in one colour, the ratio below, the ceiling marked), as python -m
  ferry.plot does. --compare adds, per case, a plain loop of pread (into a pinned buffer and a copy
  to the GPU for GPU memory) by the same threads, and the ratio.)";

enum class Mode { kRead, kWrite, kRandRead, kRandWrite };

bool is_write(Mode m) { return m == Mode::kWrite || m == Mode::kRandWrite; }
bool is_random(Mode m) { return m == Mode::kRandRead || m == Mode::kRandWrite; }
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kRead:
      return "read";
    case Mode::kWrite:
      return "write";
    case Mode::kRandRead:
      return "randread";
    case Mode::kRandWrite:
      return "randwrite";
  }
  return "read";
}

Mode parse_mode(const std::string& text) {
  static const std::map<std::string, Mode> kModes = {
      {"0", Mode::kRead},      {"read", Mode::kRead},           {"1", Mode::kWrite},
      {"write", Mode::kWrite}, {"2", Mode::kRandRead},          {"randread", Mode::kRandRead},
      {"3", Mode::kRandWrite}, {"randwrite", Mode::kRandWrite},
  };
  auto it = kModes.find(text);
  if (it == kModes.end()) {
    throw Error(fmt::format(
        "-I/--mode '{}': expected read, write, randread, randwrite (or gdsio's 0, 1, 2, 3)", text));
  }
  return it->second;
}

struct Memory {
  std::string name;  // as given: host, pinned, gpu:N
  MemoryKind kind = MemoryKind::kHostPageable;
  int device = -1;
};

// "host", "pinned", "gpu" (GPU 0) or "gpu:N", resolved as `ferry read` resolves --host,
// --pinned and --gpu N (a GPU without a driver fails with the same message).
Memory resolve_memory(const std::string& text) {
  MemoryChoice choice;
  if (text == "host") {
    choice.host = true;
  } else if (text == "pinned") {
    choice.pinned = true;
  } else if (text == "gpu" || text.rfind("gpu:", 0) == 0) {
    const std::string digits = text == "gpu" ? "0" : text.substr(4);
    if (!is_gpu_ordinal(digits)) {
      throw Error(fmt::format("--memory '{}': expected gpu:N with N a GPU ordinal", text));
    }
    choice.gpu = std::stoi(digits);
  } else if (text != "auto") {
    throw Error(fmt::format("--memory '{}': expected gpu:N, pinned, host or auto", text));
  }
  const ChosenMemory target = choose_memory_or_throw(choice);
  Memory m;
  m.kind = target.memory.kind;
  m.device = target.memory.device;
  m.name = is_gpu(m.kind)                      ? fmt::format("gpu:{}", m.device)
           : m.kind == MemoryKind::kHostPinned ? "pinned"
                                               : "host";
  return m;
}

// --route as FileOptions settings.
SettingsOverride route_settings(const std::string& route) {
  SettingsOverride o;
  if (route == "auto") return o;
  if (route == "posix") {
    o.compat_mode = CompatMode::kOn;
  } else if (route == "cufile") {
    o.compat_mode = CompatMode::kOff;
    o.require = Require::kCufile;
  } else if (route == "gds") {
    o.compat_mode = CompatMode::kOff;
    o.require = Require::kGds;
  } else {
    throw Error(fmt::format("--route '{}': expected auto, posix, cufile or gds", route));
  }
  return o;
}

struct BenchArgs {
  std::string mode = "read";
  int transfer = -1;
  int gpu = 0;
  bool gpu_given = false;  // -d/--gpu on the command line: that GPU, never host memory
  std::string sizes = "1MiB";
  std::string jobs = "1";
  int depth = 1;
  std::string total;
  double seconds = 0;
  std::string memory = "auto";
  std::string routes = "auto";
  std::string threads;      // ferry's worker threads, as in ferry read
  std::string old_workers;  // --workers: the former name of --threads
  std::string old_size;     // --size: the former name of --io-size
  std::string task_size;
  bool direct = false;
  bool cold = false;
  bool compare = false;
  bool ceiling = false;
  bool json = false;
  std::string plot;  // --plot FILE: also draw the results (plot.h)
  std::string file;
  std::string dir = ".";
  std::string file_size = "1GiB";
  std::uint64_t seed = 1;
};

// --- The file -----------------------------------------------------------------------------

// The benchmark's file: the one named, or a temporary one made of random bytes and removed
// at the end, or at SIGINT, SIGTERM or SIGHUP.
class BenchFile {
 public:
  BenchFile(const BenchArgs& a, bool writes) {
    if (!a.file.empty()) {
      path_ = a.file;
      if (std::filesystem::exists(path_)) {
        std::error_code ec;
        size_ = std::filesystem::file_size(path_, ec);
        if (ec) throw Error(fmt::format("--file {}: {}", path_, ec.message()));
        return;
      }
      if (!writes) throw Error(fmt::format("--file {}: no such file to read", path_));
      note_ = fmt::format("created {} ({}), kept", path_,
                          format_size(parse_size(a.file_size, "--file-size")));
    } else {
      std::string tmpl = (std::filesystem::path(a.dir) / "ferry-bench.XXXXXX").string();
      int fd = ::mkstemp(tmpl.data());
      if (fd < 0) {
        throw Error(
            fmt::format("cannot create a file in --dir {}: {}", a.dir, std::strerror(errno)));
      }
      ::close(fd);
      path_ = tmpl;
      temporary_ = true;
      // A bench stopped by Ctrl-C, a timeout's SIGTERM or a closed terminal leaves no 1 GiB file.
      remove_on_signals(tmpl, {SIGINT, SIGTERM, SIGHUP});
    }
    try {
      size_ = parse_size(a.file_size, "--file-size");
      Buffer chunk(MemoryKind::kHostPageable, std::min<std::uint64_t>(size_, 4u << 20));
      fill_pattern(chunk, "random", a.seed);
      File out(path_, "w");
      for (std::uint64_t off = 0; off < size_; off += chunk.size()) {
        out.write(chunk.data(), std::min<std::uint64_t>(chunk.size(), size_ - off), off);
      }
      out.sync();
    } catch (...) {
      remove_temporary();  // no destructor runs for a constructor that throws
      throw;
    }
  }
  ~BenchFile() { remove_temporary(); }
  BenchFile(const BenchFile&) = delete;
  BenchFile& operator=(const BenchFile&) = delete;

  const std::string& path() const { return path_; }
  std::uint64_t size() const { return size_; }
  bool temporary() const { return temporary_; }
  const std::string& note() const { return note_; }

 private:
  void remove_temporary() {
    if (!temporary_) return;
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_DFL);
    forget_signal_temp();
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }

  std::string path_;
  std::uint64_t size_ = 0;
  bool temporary_ = false;
  std::string note_;
};

// The fraction of the file's pages in the page cache, every page looked at (ferry's one
// residency measurement, ferry/page_cache.h).
double resident_fraction(const std::string& path, std::uint64_t size) {
  const PageCacheResidency r = page_cache_residency(path, 0, size, Residency::kExact);
  if (!r.known) throw Error(fmt::format("page-cache residency of {}: {}", path, r.why_not));
  return r.fraction();
}

// Cold: written-back, then the file's pages dropped. Returns what stayed resident.
double drop_pages(const std::string& path, std::uint64_t size) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(fmt::format("open {}: {}", path, std::strerror(errno)));
  ::fdatasync(fd);
  const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (rc != 0) throw Error(fmt::format("posix_fadvise(DONTNEED) {}: {}", path, std::strerror(rc)));
  return resident_fraction(path, size);
}

// Before a write case: the file's pages cached and clean, so that every case starts alike (a
// write over dirty pages costs less than one that dirties clean pages, which favoured whichever
// case ran second). Returns the fraction of the file's pages in the page cache.
double clean_pages(const std::string& path, std::uint64_t size) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(fmt::format("open {}: {}", path, std::strerror(errno)));
  const int rc = ::fdatasync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(fmt::format("fdatasync {}: {}", path, std::strerror(err)));
  return resident_fraction(path, size);
}

// Warm: every page read once (skipped when they are all there already).
double warm_pages(const std::string& path, std::uint64_t size) {
  if (resident_fraction(path, size) >= 1.0) return 1.0;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(fmt::format("open {}: {}", path, std::strerror(errno)));
  std::vector<char> chunk(std::size_t{4} << 20);
  for (std::uint64_t off = 0; off < size; off += chunk.size()) {
    if (::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(off)) <= 0) break;
  }
  ::close(fd);
  return resident_fraction(path, size);
}

// --- Running a case -----------------------------------------------------------------------

// What issues the requests of a case: issue() starts request `slot` of thread `t`, finish()
// waits for it and returns its bytes. Slots of one thread are used in order.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual void issue(int t, int slot, std::uint64_t offset) = 0;
  virtual std::size_t finish(int t, int slot) = 0;
  // The warm-up is over: what is recorded of the first request starts again.
  virtual void warmed() {}
};

// Each thread's destination (or source) memory: `depth` slots of the request size, in a
// Buffer of the thread's own (a Buffer is not shared between threads).
struct Slots {
  std::vector<Buffer> buffers;
  std::size_t io = 0;
  Slots(const Memory& m, int threads, int depth, std::size_t io_size, bool fill) : io(io_size) {
    for (int t = 0; t < threads; ++t) {
      buffers.emplace_back(m.kind, io * depth, std::max(m.device, 0));
      if (fill) {
        fill_pattern(buffers.back(), "random", static_cast<std::uint64_t>(t) + 7);
      } else {
        buffers.back().fill(0);  // touched: a first run pays no page faults the next does not
      }
    }
  }
  char* at(int t, int slot) const {
    return static_cast<char*>(buffers[t].data()) + static_cast<std::size_t>(slot) * io;
  }
};

class FerryEngine : public Engine {
 public:
  FerryEngine(File& file, Slots& slots, int depth, bool write)
      : file_(file),
        slots_(slots),
        depth_(depth),
        write_(write),
        futures_(slots.buffers.size() * depth) {}
  void issue(int t, int slot, std::uint64_t offset) override {
    IoFuture& f = futures_[static_cast<std::size_t>(t) * depth_ + slot];
    f = write_ ? file_.pwrite(slots_.at(t, slot), slots_.io, offset)
               : file_.pread(slots_.at(t, slot), slots_.io, offset);
  }
  std::size_t finish(int t, int slot) override {
    IoFuture& f = futures_[static_cast<std::size_t>(t) * depth_ + slot];
    const std::size_t n = f.get();
    if (t == 0 && !first_) first_ = f.route();
    f = IoFuture();
    return n;
  }
  void warmed() override { first_.reset(); }
  const std::optional<RouteReport>& first_route() const { return first_; }

 private:
  File& file_;
  Slots& slots_;
  int depth_;
  bool write_;
  std::vector<IoFuture> futures_;
  std::optional<RouteReport> first_;
};

std::size_t full_io(int fd, char* buf, std::size_t len, std::uint64_t off, bool write) {
  std::size_t done = 0;
  while (done < len) {
    const off_t at = static_cast<off_t>(off + done);
    ssize_t n =
        write ? ::pwrite(fd, buf + done, len - done, at) : ::pread(fd, buf + done, len - done, at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(fmt::format("{}: {}", write ? "pwrite" : "pread", std::strerror(errno)));
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

// The baseline: one synchronous pread (pwrite) per request, straight into host memory, or
// through a pinned buffer and a copy for GPU memory (and through an aligned buffer for
// --direct). Also the ceiling: the copy alone, no file.
class PlainEngine : public Engine {
 public:
  enum class What { kPreadCopy, kCopyOnly };
  PlainEngine(What what, const std::string& path, bool direct, Slots& slots, const Memory& m,
              bool write)
      : what_(what), slots_(slots), gpu_(is_gpu(m.kind)), direct_(direct), write_(write) {
    if (what_ == What::kPreadCopy) {
      fd_ = ::open(path.c_str(), (write ? O_WRONLY : O_RDONLY) | (direct ? O_DIRECT : 0));
      if (fd_ < 0) throw Error(fmt::format("open {}: {}", path, std::strerror(errno)));
    }
    if (gpu_ || direct_ || what_ == What::kCopyOnly) {
      for (std::size_t t = 0; t < slots.buffers.size(); ++t) {
        staging_.emplace_back(gpu_ ? MemoryKind::kHostPinned : MemoryKind::kHostPageable, slots.io,
                              std::max(m.device, 0));
        staging_.back().fill(1);
      }
    }
    done_.assign(slots.buffers.size(), 0);
  }
  ~PlainEngine() override {
    if (fd_ >= 0) ::close(fd_);
  }
  PlainEngine(const PlainEngine&) = delete;
  PlainEngine& operator=(const PlainEngine&) = delete;

  void issue(int t, int slot, std::uint64_t offset) override {
    char* dst = slots_.at(t, slot);
    const std::size_t io = slots_.io;
    Buffer& own = slots_.buffers[t];
    const std::size_t at = static_cast<std::size_t>(slot) * io;
    if (what_ == What::kCopyOnly) {
      char* stage = static_cast<char*>(staging_[t].data());
      if (gpu_) {
        write_ ? own.copy_to_host(stage, io, at) : own.copy_from_host(stage, io, at);
      } else {
        write_ ? std::memcpy(stage, dst, io) : std::memcpy(dst, stage, io);
      }
      done_[t] = io;
      return;
    }
    if (staging_.empty()) {
      done_[t] = full_io(fd_, dst, io, offset, write_);
      return;
    }
    char* stage = static_cast<char*>(staging_[t].data());
    if (write_) {
      if (gpu_) {
        own.copy_to_host(stage, io, at);
      } else {
        std::memcpy(stage, dst, io);
      }
      done_[t] = full_io(fd_, stage, io, offset, true);
      return;
    }
    const std::size_t n = full_io(fd_, stage, io, offset, false);
    if (gpu_) {
      own.copy_from_host(stage, n, at);
    } else {
      std::memcpy(dst, stage, n);
    }
    done_[t] = n;
  }
  std::size_t finish(int t, int) override { return done_[t]; }

 private:
  What what_;
  Slots& slots_;
  bool gpu_;
  bool direct_;
  bool write_;
  int fd_ = -1;
  std::vector<Buffer> staging_;
  std::vector<std::size_t> done_;
};

struct Load {
  Mode mode = Mode::kRead;
  std::size_t io = 0;
  int threads = 1;
  int depth = 1;
  std::uint64_t total = 0;  // bytes in all, or
  double seconds = 0;       // a time
  std::uint64_t file_size = 0;
  std::uint64_t seed = 1;
  bool progress = false;  // draw a progress line (progress_wanted)
};

struct Measured {
  std::uint64_t bytes = 0;
  std::uint64_t requests = 0;
  double seconds = 0;
  double cpu = 0;
  std::vector<double> latency_us;
};

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// Before a case is timed: one request per thread, which starts ferry's workers and opens what
// the first request opens, so that no case pays the process's first-use costs. Not counted;
// before the pages are dropped for a cold case.
void warm_up(Engine& engine, int threads) {
  for (int t = 0; t < threads; ++t) {
    engine.issue(t, 0, 0);
    engine.finish(t, 0);
  }
  engine.warmed();
}

// Runs the load on its threads, drawing progress on a terminal; rethrows the first error.
Measured run_load(Engine& engine, const Load& load, const std::string& label) {
  const std::uint64_t units = load.file_size / load.io;
  const std::uint64_t per_region = units / static_cast<std::uint64_t>(load.threads);
  const std::uint64_t requests = (load.total + load.io - 1) / load.io;
  const bool timed = load.seconds > 0;
  std::atomic<bool> go{false};
  std::atomic<bool> failed{false};
  std::atomic<std::uint64_t> progress{0};
  std::exception_ptr error;
  std::atomic_flag error_set = ATOMIC_FLAG_INIT;
  std::vector<std::vector<double>> latency(load.threads);
  std::vector<std::uint64_t> bytes(load.threads, 0);
  std::vector<Clock::time_point> ended(load.threads);
  std::atomic<int> running{load.threads};
  Clock::time_point deadline;
  std::vector<std::thread> pool;
  for (int t = 0; t < load.threads; ++t) {
    pool.emplace_back([&, t] {
      const std::uint64_t quota =
          requests / load.threads + (t < static_cast<int>(requests % load.threads) ? 1 : 0);
      std::mt19937_64 rng(load.seed * 1000003 + static_cast<std::uint64_t>(t));
      std::uniform_int_distribution<std::uint64_t> pick(0, units - 1);
      std::vector<Clock::time_point> started(load.depth);
      std::vector<char> busy(load.depth, 0);
      std::vector<double>& lat = latency[t];
      lat.reserve(timed ? 4096 : quota);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      std::uint64_t issued = 0;
      int slot = 0;
      auto complete = [&](int s) {
        const std::size_t n = engine.finish(t, s);
        lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - started[s]).count());
        bytes[t] += n;
        progress.fetch_add(n, std::memory_order_relaxed);
        busy[s] = 0;
      };
      try {
        for (;;) {
          if (busy[slot]) complete(slot);
          const bool more = !failed.load(std::memory_order_relaxed) &&
                            (timed ? Clock::now() < deadline : issued < quota);
          if (!more) {
            for (int k = 1; k < load.depth; ++k) {
              const int s = (slot + k) % load.depth;
              if (busy[s]) complete(s);
            }
            break;
          }
          const std::uint64_t unit =
              is_random(load.mode)
                  ? pick(rng)
                  : static_cast<std::uint64_t>(t) * per_region + issued % per_region;
          started[slot] = Clock::now();
          busy[slot] = 1;
          engine.issue(t, slot, unit * load.io);
          ++issued;
          slot = (slot + 1) % load.depth;
        }
      } catch (...) {
        failed = true;
        if (!error_set.test_and_set()) error = std::current_exception();
        // Requests still in flight are waited for (their futures' destructors) by the engine.
        for (int s = 0; s < load.depth; ++s) {
          if (busy[s]) {
            try {
              engine.finish(t, s);
            } catch (...) {
            }
          }
        }
      }
      ended[t] = Clock::now();
      running.fetch_sub(1, std::memory_order_release);
    });
  }
  const double cpu0 = cpu_seconds();
  const auto start = Clock::now();
  deadline = start + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(load.seconds));
  go.store(true, std::memory_order_release);
  // The threads time themselves: this loop only draws the line.
  ProgressBar bar(label, timed ? 0 : load.total, load.progress, load.seconds);
  while (load.progress && running.load(std::memory_order_acquire) > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    bar.update(progress.load(std::memory_order_relaxed));
  }
  for (auto& th : pool) th.join();
  Measured m;
  m.cpu = cpu_seconds() - cpu0;
  m.seconds =
      std::chrono::duration<double>(*std::max_element(ended.begin(), ended.end()) - start).count();
  bar.clear();
  if (error) std::rethrow_exception(error);
  for (int t = 0; t < load.threads; ++t) {
    m.bytes += bytes[t];
    m.latency_us.insert(m.latency_us.end(), latency[t].begin(), latency[t].end());
  }
  m.requests = m.latency_us.size();
  std::sort(m.latency_us.begin(), m.latency_us.end());
  return m;
}

nlohmann::json measured_json(const Measured& m) {
  double mean = 0;
  for (double v : m.latency_us) mean += v;
  mean = m.latency_us.empty() ? 0 : mean / static_cast<double>(m.latency_us.size());
  return {{"bytes", m.bytes},
          {"requests", m.requests},
          {"seconds", m.seconds},
          {"gbps", gbps(m.bytes, m.seconds)},
          {"iops", m.seconds > 0 ? static_cast<double>(m.requests) / m.seconds : 0.0},
          {"latency_us",
           {{"p50", percentile(m.latency_us, 0.50)},
            {"p99", percentile(m.latency_us, 0.99)},
            {"p99_9", percentile(m.latency_us, 0.999)},
            {"mean", mean},
            {"max", m.latency_us.empty() ? 0.0 : m.latency_us.back()}}},
          {"cpu_seconds", m.cpu},
          {"cpu_seconds_per_gib", cpu_seconds_per_gib(m.cpu, m.bytes)}};
}

// --- The table ----------------------------------------------------------------------------

void print_header() {
  fmt::print("{:<9} {:>8} {:>3} {:>3} {:<8} {:<10} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}\n",
             "mode", "size", "thr", "dep", "memory", "route", "GB/s", "IOPS", "p50 us", "p99 us",
             "p99.9 us", "CPU-s/GiB", "ratio");
}

void print_row(const nlohmann::json& j) {
  const auto& lat = j["latency_us"];
  const std::string ratio =
      j.contains("ratio") ? fmt::format("{:.2f}x", j["ratio"].get<double>()) : "";
  fmt::print(
      "{:<9} {:>8} {:>3} {:>3} {:<8} {:<10} {:>8.3f} {:>9.0f} {:>9.1f} {:>9.1f} {:>9.1f} "
      "{:>9.3f} {:>7}\n",
      j["mode"].get<std::string>(), format_size(j["io_size"].get<std::uint64_t>()),
      j["threads"].get<int>(), j["depth"].get<int>(), j["memory"].get<std::string>(),
      j["route"].get<std::string>(), j["gbps"].get<double>(), j["iops"].get<double>(),
      lat["p50"].get<double>(), lat["p99"].get<double>(), lat["p99_9"].get<double>(),
      j["cpu_seconds_per_gib"].get<double>(), ratio);
}

// --- The command --------------------------------------------------------------------------

struct Sweep {  // the cases one `ferry bench` runs
  Mode mode = Mode::kRead;
  std::vector<std::size_t> sizes;
  std::vector<int> threads;
  std::vector<Memory> memories;
  std::vector<std::string> routes;
  std::vector<std::string> notes;
};

constexpr std::size_t kSmallestRequest = 512;

Sweep make_sweep(const BenchArgs& a) {
  Sweep p;
  p.mode = parse_mode(a.mode);
  for (const std::string& s : split_list(a.sizes)) {
    p.sizes.push_back(parse_size(s, "--io-size"));
    // Below a sector, a request measures the system call, not the storage, and a case of 1 GiB
    // would take hours (issue 30, finding 10).
    if (p.sizes.back() < kSmallestRequest) {
      throw Error(
          fmt::format("--io-size {}: requests below {} B measure the system call, not the "
                      "storage; use {} B or more",
                      s, kSmallestRequest, kSmallestRequest));
    }
  }
  if (std::isnan(a.seconds)) throw Error("--time nan: not a number of seconds");
  // Checked (0 included) before the file is made, not after.
  if (!a.total.empty()) parse_size(a.total, "--total");
  for (const std::string& s : split_list(a.jobs)) {
    const std::size_t n = parse_count(s, "--jobs");
    if (n > 1024) throw Error(fmt::format("--jobs {}: at most 1024", n));
    p.threads.push_back(static_cast<int>(n));
  }
  std::vector<std::string> memories = split_list(a.memory);
  std::vector<std::string> routes = split_list(a.routes);
  // -d N alone is --memory gpu:N: a GPU asked for by number is measured or refused, never
  // replaced by host memory as --memory auto may be.
  if (a.gpu_given) memories = {fmt::format("gpu:{}", a.gpu)};
  if (a.transfer >= 0) {
    const std::string gpu = fmt::format("gpu:{}", a.gpu);
    switch (a.transfer) {
      case 0:
        memories = {gpu};
        routes = {"cufile"};
        break;
      case 1:
        memories = {"host"};
        routes = {"posix"};
        break;
      case 2:
      case 3:
        memories = {gpu};
        routes = {"posix"};
        if (a.transfer == 3) {
          p.notes.push_back(
              "-x 3 (CPU_ASYNC_GPU) runs as -x 2: ferry's POSIX path overlaps the copy to the GPU "
              "with the next read");
        }
        break;
      default:
        throw Error(fmt::format(
            "-x {}: gdsio's transfer type {} has no ferry equivalent (ferry calls neither "
            "cuFile's stream nor its batch API, and reads the page cache only by its POSIX "
            "path); ferry bench --help lists the types it maps",
            a.transfer,
            a.transfer == 4   ? "4 (CPU_CACHED_GPU)"
            : a.transfer == 5 ? "5 (GPU_DIRECT_ASYNC)"
            : a.transfer == 6 ? "6 (GPU_BATCH)"
                              : "7 (GPU_BATCH_STREAM)"));
    }
  }
  for (const std::string& r : routes) {
    route_settings(r);  // checked before any work
    p.routes.push_back(r);
  }
  // Memory is resolved before the file is made, as `ferry read --gpu 0` does: no driver is the
  // first thing said.
  for (const std::string& m : memories) {
    p.memories.push_back(resolve_memory(m));
    if (m == "auto" && !is_gpu(p.memories.back().kind)) {
      p.notes.push_back(choose_memory_or_throw(MemoryChoice{}).note);
    }
  }
  if (a.cold && is_write(p.mode)) {
    throw Error(
        "--cold applies to reads: writes land in the page cache whether its pages were "
        "there or not");
  }
  return p;
}

int run(const BenchArgs& a) {
  Sweep sweep = make_sweep(a);
  const bool write = is_write(sweep.mode);
  // The file's size is known before it is made, so that a request larger than the file is
  // refused without writing a 1 GiB file first.
  std::uint64_t planned = 0;
  std::error_code ec;
  if (!a.file.empty() && std::filesystem::exists(a.file, ec)) {
    planned = std::filesystem::file_size(a.file, ec);
  } else {
    planned = parse_size(a.file_size, "--file-size");
  }
  const std::size_t largest = *std::max_element(sweep.sizes.begin(), sweep.sizes.end());
  const int most = *std::max_element(sweep.threads.begin(), sweep.threads.end());
  if (!ec && planned / largest < static_cast<std::uint64_t>(is_random(sweep.mode) ? 1 : most)) {
    throw Error(fmt::format(
        "the file ({}) holds {} request(s) of {}: fewer than {}; use a larger --file-size",
        format_size(planned), planned / largest, format_size(largest),
        is_random(sweep.mode) ? "one" : "one per thread"));
  }
  // Before the file is made and anything measured: a plot that cannot be drawn fails now.
  const std::string python = a.plot.empty() ? std::string() : check_plot(a.plot);
  std::vector<nlohmann::json> records;  // what --plot draws: every line --json would print
  auto emit = [&](const nlohmann::json& j) {
    a.json ? fmt::print("{}\n", json_text(j)) : print_row(j);
    if (!a.plot.empty()) records.push_back(j);
  };
  BenchFile file(a, write);
  if (!file.note().empty()) sweep.notes.push_back(file.note());
  const std::uint64_t total = a.total.empty() ? file.size() : parse_size(a.total, "--total");
  if (a.cold && a.seconds <= 0 && total > file.size()) {
    sweep.notes.push_back(fmt::format(
        "--total ({}) is more than the file ({}): what is read again after the first pass comes "
        "from the page cache",
        format_size(total), format_size(file.size())));
  }
  const std::string page_state = write ? "" : a.cold ? "cold" : "warm";
  if (!a.json) {
    fmt::print("ferry bench: {} of {} ({}{}), {}{}{}\n", mode_name(sweep.mode), file.path(),
               format_size(file.size()), file.temporary() ? ", temporary" : "",
               a.seconds > 0 ? fmt::format("{} s per case", a.seconds)
                             : fmt::format("{} per case", format_size(total)),
               page_state.empty() ? "" : ", " + page_state + " page cache",
               a.direct ? ", O_DIRECT" : "");
    for (const std::string& n : sweep.notes) fmt::print("note: {}\n", n);
    print_header();
  }
  int failures = 0;
  std::map<std::string, double> baselines;
  auto prepare = [&](nlohmann::json& j) {
    if (write) {
      j["page_cache_before"] = {
          {"resident_fraction", clean_pages(file.path(), file.size())},
          {"dirty", false},
          {"method", "fdatasync, then ferry::page_cache_residency (every page)"}};
      return;
    }
    const double kept =
        a.cold ? drop_pages(file.path(), file.size()) : warm_pages(file.path(), file.size());
    j["page_cache_before"] = {{"resident_fraction", kept},
                              {"method", "ferry::page_cache_residency (every page)"}};
    if (a.cold && kept > 0.01) {
      j["cold"] = false;
      j["cold_note"] = fmt::format(
          "the kernel kept {:.0f}% of the file's pages after posix_fadvise(DONTNEED) (tmpfs, or "
          "pages mapped by another process): this run read them from memory",
          kept * 100);
    }
  };
  for (const Memory& memory : sweep.memories) {
    for (const std::string& route : sweep.routes) {
      FileOptions options;
      options.direct = a.direct;
      options.settings = route_settings(route);
      if (!a.threads.empty()) {
        options.settings.nthreads = parse_count(a.threads, "--threads");
        options.settings.host_nthreads = options.settings.nthreads;
      }
      if (!a.task_size.empty()) options.settings.task_size = parse_size(a.task_size, "--task-size");
      for (int threads : sweep.threads) {
        for (std::size_t io : sweep.sizes) {
          Load load{sweep.mode, io, threads, a.depth, total, a.seconds, file.size(), a.seed};
          load.progress = progress_wanted(a.json);
          nlohmann::json j = {{"case", "ferry"},
                              {"mode", mode_name(sweep.mode)},
                              {"io_size", io},
                              {"threads", threads},
                              {"depth", a.depth},
                              {"memory", memory.name},
                              {"memory_kind", to_string(memory.kind)},
                              {"device", memory.device},
                              {"route", route},
                              {"direct", a.direct},
                              {"file", file.path()},
                              {"file_size", file.size()}};
          if (!write) j["cold"] = a.cold;
          if (!sweep.notes.empty()) j["notes"] = sweep.notes;
          const std::string label =
              fmt::format("{} {} x{}", mode_name(sweep.mode), format_size(io), threads);
          try {
            Slots slots(memory, threads, a.depth, io, write);
            std::optional<RouteReport> first;
            {
              File f(file.path(), write ? "r+" : "r", options);
              FerryEngine engine(f, slots, a.depth, write);
              warm_up(engine, threads);
              prepare(j);
              j.update(measured_json(run_load(engine, load, label)));
              first = engine.first_route();
              const RouteReport last = f.last_route();
              j["verdict"] = last.verdict();
              if (first && first->verdict() != last.verdict())
                j["first_verdict"] = first->verdict();
              if (first) {
                j["first_request_page_cache"] =
                    nlohmann::json::parse(first->to_json())["page_cache"];
              }
            }
            const std::string key = fmt::format("{}/{}/{}", memory.name, threads, io);
            nlohmann::json baseline;  // printed after the case it is the baseline of
            if (a.compare) {
              if (!baselines.count(key)) {
                Load plain = load;
                plain.depth = 1;
                Slots own(memory, threads, 1, io, write);
                PlainEngine engine(PlainEngine::What::kPreadCopy, file.path(), a.direct, own,
                                   memory, write);
                nlohmann::json b = j;
                for (const char* k :
                     {"verdict", "first_verdict", "first_request_page_cache", "cold_note"})
                  b.erase(k);
                b["case"] = "baseline";
                b["route"] = is_gpu(memory.kind) ? "pread+copy" : "pread";
                b["depth"] = 1;
                if (!write) b["cold"] = a.cold;
                warm_up(engine, threads);
                prepare(b);
                b.update(measured_json(run_load(engine, plain, label + " baseline")));
                baselines[key] = b["gbps"].get<double>();
                baseline = b;
              }
              if (baselines[key] > 0) j["ratio"] = j["gbps"].get<double>() / baselines[key];
            }
            emit(j);
            if (!a.json) {
              fmt::print("  route: {}\n", j["verdict"].get<std::string>());
              if (j.contains("cold_note"))
                fmt::print("  note: {}\n", j["cold_note"].get<std::string>());
            }
            if (!baseline.is_null()) emit(baseline);
            if (a.ceiling && !baselines.count("ceiling/" + key)) {
              Slots own(memory, threads, 1, io, write);
              PlainEngine engine(PlainEngine::What::kCopyOnly, file.path(), false, own, memory,
                                 write);
              Load copy = load;
              copy.depth = 1;
              nlohmann::json c = {{"case", "ceiling"},
                                  {"mode", mode_name(sweep.mode)},
                                  {"io_size", io},
                                  {"threads", threads},
                                  {"depth", 1},
                                  {"memory", memory.name},
                                  {"memory_kind", to_string(memory.kind)},
                                  {"device", memory.device},
                                  {"route", is_gpu(memory.kind) ? "pinned copy" : "memcpy"}};
              warm_up(engine, threads);
              c.update(measured_json(run_load(engine, copy, label + " ceiling")));
              baselines["ceiling/" + key] = c["gbps"].get<double>();
              emit(c);
            }
          } catch (const CudaError&) {
            throw;  // the machine, not the case: as `ferry read` says it
          } catch (const std::exception& e) {
            ++failures;
            j["error"] = e.what();
            if (!a.plot.empty()) records.push_back(j);
            if (a.json) {
              fmt::print("{}\n", json_text(j));
            } else {
              fmt::print("{:<9} {:>8} {:>3} {:>3} {:<8} {:<10} failed: {}\n", mode_name(sweep.mode),
                         format_size(io), threads, a.depth, memory.name, route, e.what());
            }
          }
          std::fflush(stdout);
        }
      }
    }
  }
  if (!a.plot.empty()) {
    std::fflush(stdout);
    draw_plot(python, a.plot, records);
    fmt::print(a.json ? stderr : stdout, "plot: {} (its results: {})\n", a.plot,
               plot_results_path(a.plot));
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

void add_bench_command(CLI::App& app, std::function<int()>& action) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Measure reads or writes as a loader would see them (gdsio-style): GB/s, IOPS, latency "
      "percentiles, CPU-s/GiB and the route, per case");
  cmd->footer(kHelpFooter);
  cmd->add_option("-I,--mode", a->mode, "read, write, randread or randwrite (gdsio -I 0-3)")
      ->capture_default_str();
  auto* x = cmd->add_option("-x,--transfer", a->transfer,
                            "gdsio transfer type: 0 cuFile into GPU memory, 1 host memory, 2 or 3 "
                            "POSIX into GPU memory (see below)")
                ->check(whole_number("a gdsio transfer type", 0, 7));
  auto* gpu = cmd->add_option("-d,--gpu", a->gpu,
                              "GPU ordinal: for -x 0, 2 and 3, else alone the same as --memory "
                              "gpu:N (an error without a driver, never host memory)")
                  ->check(whole_number("a GPU ordinal", 0, 9999))
                  ->capture_default_str();
  cmd->add_option("-i,--io-size", a->sizes, "Request size, or several: 4KiB,64KiB,1MiB (a sweep)")
      ->capture_default_str();
  cmd->add_option("-w,--jobs", a->jobs, "Threads issuing requests, or several: 1,2,4 (a sweep)")
      ->capture_default_str();
  // The former names, kept working with a warning (hidden from --help).
  cmd->add_option("--size", a->old_size)->group("");
  cmd->add_option("--workers", a->old_workers)->group("");
  cmd->add_option("--depth", a->depth, "Requests in flight per thread")
      ->check(whole_number("a number of requests in flight", 1, 1024))
      ->capture_default_str();
  auto* total = cmd->add_option("--total", a->total, "Bytes per case (default: the file's size)");
  auto* time = cmd->add_option("-T,--time", a->seconds, "Seconds per case, instead of --total")
                   ->check(seconds_above_zero(7 * 86400.0));
  total->excludes(time);
  auto* memory = cmd->add_option("--memory", a->memory,
                                 "gpu:N, pinned, host, or several (a sweep); auto: GPU 0 when one "
                                 "exists, else host")
                     ->capture_default_str();
  auto* route = cmd->add_option("--route", a->routes, "auto, posix, cufile, gds, or several")
                    ->capture_default_str();
  x->excludes(memory)->excludes(route);
  gpu->excludes(memory);
  cmd->add_option("--threads", a->threads,
                  "ferry's worker threads, for GPU and host memory alike, as in ferry read "
                  "(FERRY_NTHREADS and FERRY_HOST_NTHREADS); the issuing threads are -w/--jobs");
  cmd->add_option("--task-size", a->task_size, "ferry's task size (FERRY_TASK_SIZE)");
  cmd->add_flag("--direct", a->direct, "O_DIRECT, for ferry and the baseline alike");
  cmd->add_flag("--cold", a->cold, "Drop the file's pages before every run (reads)");
  cmd->add_flag("--compare", a->compare,
                "Also run a plain pread (+ copy) loop, and give the ratio");
  cmd->add_flag(
      "--ceiling", a->ceiling,
      "Also measure the copy alone into that memory (memcpy, or a pinned copy to the GPU)");
  cmd->add_flag("--json", a->json, "One JSON object per case (JSON lines), no table");
  cmd->add_option("--plot", a->plot,
                  "Also draw the results into FILE (.png, .svg or .pdf; needs Python's "
                  "matplotlib), with their JSON lines beside it as FILE.jsonl")
      ->type_name("FILE");
  auto* file = cmd->add_option(
      "-f,--file", a->file, "File to use (writes overwrite it; made of --file-size when missing)");
  auto* dir =
      cmd->add_option("-D,--dir", a->dir, "Where the temporary file is made (removed at the end)")
          ->capture_default_str();
  file->excludes(dir);
  cmd->add_option("-s,--file-size", a->file_size, "Size of the file made")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the random offsets and the file's bytes")
      ->capture_default_str();
  cmd->callback([a, gpu, &action] {
    a->gpu_given = gpu->count() > 0;
    if (a->threads.find(',') != std::string::npos) {
      throw CLI::ValidationError(
          "--threads",
          "sets ferry's worker threads (one number), as in ferry read; a sweep of "
          "threads issuing requests is -w/--jobs " +
              a->threads);
    }
    if (!a->old_size.empty()) {
      fmt::print(stderr, "ferry: warning: bench --size is now --io-size (-i)\n");
      a->sizes = a->old_size;
    }
    if (!a->old_workers.empty()) {
      fmt::print(stderr, "ferry: warning: bench --workers is now --threads, as in ferry read\n");
      if (a->threads.empty()) a->threads = a->old_workers;
    }
    action = [a] { return run(*a); };
  });
}

}  // namespace ferry::cli
