#include "core/request.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <vector>

#include "core/backend.h"
#include "core/route_facts.h"
#include "core/routing.h"
#include "core/runtime_state.h"
#include "core/stats_recorder.h"
#include "core/task_splitter.h"
#include "core/thread_pool.h"
#include "cuda/quick_memory.h"
#include "cufile/cufile_backend.h"
#include "cufile/cufile_outlook.h"
#include "cufile/cufile_stats.h"
#include "cufile/cufile_testing.h"
#include "ferry/error.h"
#include "posix/page_cache.h"
#include "posix/posix_backend.h"

namespace ferry::core {

void RequestState::complete(std::size_t bytes, std::exception_ptr error, RouteReport report) {
  {
    std::lock_guard lock(mu_);
    bytes_ = bytes;
    error_ = std::move(error);
    report_ = std::move(report);
    done_ = true;
  }
  cv_.notify_all();
}

bool RequestState::ready() const {
  std::lock_guard lock(mu_);
  return done_;
}

void RequestState::wait() const {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return done_; });
}

bool RequestState::wait_for(double seconds) const {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; });
}

std::size_t RequestState::get() const {
  wait();
  std::lock_guard lock(mu_);
  if (error_) std::rethrow_exception(error_);
  return bytes_;
}

void RequestState::complete(std::size_t bytes, std::shared_ptr<OpenFile> file,
                            const SmallRoute& route) {
  {
    std::lock_guard lock(mu_);
    bytes_ = bytes;
    small_file_ = std::move(file);
    small_ = route;
    done_ = true;
  }
  cv_.notify_all();
}

RouteReport RequestState::route() const {
  wait();
  std::lock_guard lock(mu_);
  if (small_) return small_report(*small_file_, *small_);
  return report_;
}

namespace {

using Clock = std::chrono::steady_clock;

RouteReason cold_direct_reason(const RouteReport& report) {
  // Measured on the GPU machine's disk (bench/NOTES.md §9): O_DIRECT read cold data 1.27x faster
  // than buffered reads, at 1/26 of the CPU time.
  return {ReasonCode::kColdDirect,
          fmt::format("{} of {} task(s) were not in the page cache and were read with O_DIRECT, "
                      "faster and cheaper than buffered reads of cold data",
                      report.direct_tasks, report.tasks)};
}

// Everything the pool jobs of one request share.
struct Job : std::enable_shared_from_this<Job> {
  std::shared_ptr<OpenFile> file;
  std::shared_ptr<RequestState> state;
  Backend* backend;
  RequestContext context;
  TaskSplitter tasks;
  std::vector<std::size_t> done;  // bytes moved per task; each slot written by one job
  std::atomic<std::size_t> next{0};
  std::atomic<bool> cancelled{false};
  std::atomic<std::size_t> direct_tasks{0};
  std::atomic<bool> cold_refused{false};
  std::atomic<std::size_t> jobs_left{0};
  std::mutex error_mu;
  std::exception_ptr error;   // the first failure
  std::uint64_t partial = 0;  // bytes the failing task moved before it failed
  RouteReport report;
  Clock::time_point start;
  // The cuFile path only: the backend holding the file's handle, and layer 2's window.
  std::shared_ptr<Backend> owned_backend;
  std::unique_ptr<cufile::Observation> observation;
  bool compat_refused = false;  // cuFile's driver was opened with compatibility refused

  Job(std::shared_ptr<OpenFile> f, std::shared_ptr<RequestState> s, Backend* b, Op op, char* buffer,
      MemoryInfo memory, Settings settings, std::uint64_t offset, std::size_t size)
      : file(std::move(f)),
        state(std::move(s)),
        backend(b),
        context{*file,     op, buffer, std::move(memory), settings,
                cancelled, 1,  {},     direct_tasks,      cold_refused},
        tasks(offset, size, settings.task_size),
        done(tasks.count(), 0) {}

  void fail(std::exception_ptr e, std::uint64_t moved) {
    std::lock_guard lock(error_mu);
    if (!error) {
      error = std::move(e);
      partial = moved;
    }
    cancelled.store(true, std::memory_order_relaxed);
  }

  // One job: takes tasks until none is left. Between tasks it yields to jobs that wait in the
  // pool (other requests, which would otherwise wait for this whole request): it completes its
  // work in flight and queues its continuation behind them.
  void run_one() {
    try {
      std::unique_ptr<Worker> worker = backend->make_worker(context);
      for (;;) {
        if (cancelled.load(std::memory_order_relaxed)) break;
        std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= tasks.count()) break;
        try {
          done[i] = worker->run(tasks[i]);
          state->add_progress(done[i]);
        } catch (const IoError& e) {
          fail(std::current_exception(), e.bytes_done());
          break;
        }
        ThreadPool& pool = context.file.runtime().pool();
        if (pool.waiting() > 0 && next.load(std::memory_order_relaxed) < tasks.count()) {
          worker->finish();
          worker.reset();
          pool.submit([job = shared_from_this()] { job->run_one(); });
          return;
        }
      }
      worker->finish();
    } catch (...) {
      fail(std::current_exception(), 0);
    }
    if (jobs_left.fetch_sub(1, std::memory_order_acq_rel) == 1) complete();
  }

  // Runs once, after every job is done.
  void complete() {
    std::size_t bytes = 0;
    if (context.op == Op::kRead) {
      // A read is the contiguous prefix up to the first task cut short by end of file.
      for (std::size_t i = 0; i < tasks.count(); ++i) {
        bytes += done[i];
        if (done[i] < tasks[i].size) break;
      }
    } else {
      for (std::size_t d : done) bytes += d;
    }
    report.bytes = bytes;
    report.direct_tasks = direct_tasks.load();
    if (report.direct_tasks > 0) report.reasons.push_back(cold_direct_reason(report));
    if (cold_refused.load()) {
      report.reasons.push_back({ReasonCode::kDirectIoRefused, file->cold_direct_refused()});
    }
    report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::exception_ptr e = error;
    if (observation) {
      observation->end(report.cufile);
      observation.reset();
      if (auto refusal = refuse_layer2(context.settings, report, compat_refused); refusal && !e) {
        e = std::make_exception_ptr(RouteError(*refusal));
      }
    }
    if (e) {
      std::uint64_t moved = 0;
      for (std::size_t d : done) moved += d;
      moved += partial;
      try {
        std::rethrow_exception(e);
      } catch (const IoError& io) {
        e = std::make_exception_ptr(io.with_bytes_done(moved));
      } catch (...) {
      }
    }
    // Every worker is gone: drop the cuFile handle's reference now, so a File closed while
    // this request ran deregisters it before the caller's wait returns.
    backend = nullptr;
    owned_backend.reset();
    record_request(report, e != nullptr);
    file->set_last_route(report);
    file->end_request();
    // Drop the file before the caller can see completion: pool threads keep this Job alive a
    // little longer, and the file (with its I/O seam) must not outlive what the caller awaits.
    file.reset();
    state->complete(bytes, e, report);
  }
};

posix::PosixBackend& posix_backend() {
  // Leaked on purpose: pool threads may still use it while static destructors run at exit.
  static auto* backend = new posix::PosixBackend;
  return *backend;
}

}  // namespace

IoFuture submit(std::shared_ptr<OpenFile> file, Op op, void* buffer, std::size_t size,
                std::uint64_t offset) {
  auto state = std::make_shared<RequestState>();
  IoFuture future(state);
  Clock::time_point start = Clock::now();
  RouteReport report;
  report.op = op;
  report.file = file->path();
  report.offset = offset;
  report.requested = size;
  bool registered = false;  // begin_request() succeeded: end_request() is owed
  auto fail_now = [&](std::exception_ptr e) {
    if (registered) file->end_request();
    record_request(report, true);
    state->complete(0, std::move(e), report);
    return std::move(future);
  };
  try {
    file->begin_request(op == Op::kRead ? "pread" : "pwrite");
    registered = true;
    if (buffer == nullptr && size > 0) {
      throw IoError(EFAULT, to_string(op), file->path(), offset, size, 0, "null buffer");
    }
    if (offset > static_cast<std::uint64_t>(LLONG_MAX) ||
        size > static_cast<std::uint64_t>(LLONG_MAX) - offset) {
      throw IoError(EOVERFLOW, to_string(op), file->path(), offset, size, 0,
                    "offset + size overflows off_t");
    }
    if (op == Op::kRead && !file->readable()) {
      throw IoError(EBADF, "pread", file->path(), offset, size, 0, "file not opened for reading");
    }
    if (op == Op::kWrite && !file->writable()) {
      throw IoError(EBADF, "pwrite", file->path(), offset, size, 0, "file not opened for writing");
    }
    Settings settings = file->settings();
    MemoryInfo memory = classify_memory(buffer);
    // Layer 1 decides on route_memory, which differs from memory only under a test hook.
    MemoryInfo route_memory = cufile::testing::route_view(memory);
    report.memory = memory.kind;
    report.device = memory.device;
    report.direct = file->direct_fd() >= 0;
    std::size_t effective = size;
    if (op == Op::kRead) {
      std::uint64_t file_size = file->size();
      effective = offset >= file_size ? 0 : std::min<std::uint64_t>(size, file_size - offset);
    }
    if (op == Op::kRead) {
      report.page_cache = posix::measure_residency(file->fd(), offset, effective);
    } else {
      report.page_cache.why_not = "not measured for writes";
    }
    cufile::Probe cufile_probe;
    RouteFacts facts = gather_route_facts(*file, settings, report.page_cache, &cufile_probe);
    RouteDecision route = decide_route(settings, route_memory, effective, facts);
    report.reasons = route.reasons;
    if (route.refusal) throw RouteError(*route.refusal);
    if (file->direct_requested() && file->direct_fd() < 0) {
      report.reasons.push_back({ReasonCode::kDirectIoRefused, file->direct_refused()});
    }
    std::shared_ptr<Backend> cufile_backend;
    Backend* backend = &posix_backend();
    if (route.path == Path::kCufile) {
      cufile_backend = std::make_shared<cufile::CufileBackend>(cufile_probe.state);
      backend = cufile_backend.get();
    }
    auto job = std::make_shared<Job>(file, state, backend, op, static_cast<char*>(buffer), memory,
                                     settings, offset, effective);
    job->start = start;
    job->owned_backend = std::move(cufile_backend);
    job->compat_refused = cufile_probe.compat_refused;
    job->context.residency = report.page_cache;
    report.tasks = job->tasks.count();
    const std::size_t threads = workers_for(settings, is_gpu(route_memory.kind));
    const std::size_t jobs = std::min(
        {threads, std::max<std::size_t>(report.tasks, 1), backend->max_workers(job->context)});
    job->context.workers = jobs;
    report.workers = report.tasks == 0 ? 0 : jobs;
    report.reasons.push_back({ReasonCode::kEngine, backend->describe(job->context)});
    if (route.path == Path::kCufile) {
      report.cufile_tasks = report.tasks;
    } else {
      report.posix_tasks = report.tasks;
      report.cufile.why_not = "no request went to cuFile";
    }
    job->report = report;
    // Last before the first task runs, so the window holds this request's cuFile calls only.
    if (route.path == Path::kCufile) job->observation = cufile::Observation::begin(op);
    if (job->tasks.count() == 0) {
      job->jobs_left = 1;
      job->complete();
      return future;
    }
    ThreadPool& pool = file->runtime().pool();
    pool.ensure_threads(jobs);
    job->jobs_left = jobs;
    for (std::size_t j = 0; j < jobs; ++j) pool.submit([job] { job->run_one(); });
  } catch (...) {
    return fail_now(std::current_exception());
  }
  return future;
}

namespace {

constexpr const char* kSmallNotMeasured =
    "not measured: a read under 1 MiB is read buffered whatever its residency";

// Layer 1 for a small request, where the cheap facts decide it, in the order of decide_route();
// nullopt where it needs more (residency, cuFile's driver): submit() takes the request then.
std::optional<ReasonCode> small_layer1(const Settings& s, const cuda::QuickMemory& memory,
                                       std::size_t size, OpenFile& file, std::string* compat_why) {
  if (s.compat_mode == CompatMode::kOn) return ReasonCode::kCompatModeOn;
  if (!is_gpu(memory.kind)) {
    return memory.noted() ? ReasonCode::kNoCudaDriver : ReasonCode::kHostBuffer;
  }
  if (s.compat_mode != CompatMode::kAuto) return std::nullopt;
  if (size < s.gds_threshold) return ReasonCode::kBelowThreshold;
  cufile::Outlook outlook = cufile::accelerated_outlook(file.fd());
  if (outlook.accelerated) return std::nullopt;
  *compat_why = std::move(outlook.why_not);
  return ReasonCode::kCufileCompatOnly;
}

// What a small request needs, checked without side effects; nullopt when it does not qualify.
std::optional<Settings> small_settings(OpenFile& file, Op op, const void* buffer, std::size_t size,
                                       std::uint64_t offset, std::size_t max_size) {
  if (buffer == nullptr || size == 0 || size > max_size || file.direct_requested()) return {};
  if (offset > static_cast<std::uint64_t>(LLONG_MAX) ||
      size > static_cast<std::uint64_t>(LLONG_MAX) - offset) {
    return {};
  }
  if (op == Op::kRead ? !file.readable() : !file.writable()) return {};
  if (cufile::testing::host_treated_as_gpu()) return {};
  Settings settings;
  try {
    settings = file.settings();
  } catch (const Error&) {
    return {};  // submit() reports the bad setting
  }
  if (size > settings.task_size || settings.require != Require::kAny) return {};
  return settings;
}

// Runs a qualifying request; `route` gets its compact report. Throws the request's error after
// recording it.
std::size_t run_small_now(OpenFile& file, Op op, void* buffer, std::size_t size,
                          std::uint64_t offset, const Settings& settings,
                          const cuda::QuickMemory& memory, SmallRoute& route) {
  const Clock::time_point start = Clock::now();
  route.op = op;
  route.offset = offset;
  route.requested = size;
  route.memory = memory;
  route.settings = settings;
  std::atomic<bool> cancelled{false};
  std::atomic<std::size_t> direct_tasks{0};
  std::atomic<bool> cold_refused{false};
  RequestContext context{file,
                         op,
                         static_cast<char*>(buffer),
                         {memory.kind, memory.device, {}},
                         settings,
                         cancelled,
                         1,
                         {},
                         direct_tasks,
                         cold_refused};
  std::size_t bytes = 0;
  try {
    if (op == Op::kRead && size >= posix::kColdTaskMin) {
      // Large enough for the cold rule: measure, as submit() does.
      const std::uint64_t file_size = file.size();
      const std::size_t effective =
          offset >= file_size ? 0 : std::min<std::uint64_t>(size, file_size - offset);
      route.page_cache = posix::measure_residency(file.fd(), offset, effective);
      context.residency = route.page_cache;
    }
    bytes = posix_backend().run_inline(context, Task{offset, 0, size});
  } catch (...) {
    route.cold_direct = direct_tasks.load() > 0;
    route.cold_refused = cold_refused.load();
    route.nanoseconds = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    RouteReport report = small_report(file, route);
    record_request(report, true);
    file.set_last_route(report);
    throw;
  }
  route.bytes = bytes;
  route.cold_direct = direct_tasks.load(std::memory_order_relaxed) > 0;
  route.cold_refused = cold_refused.load(std::memory_order_relaxed);
  route.nanoseconds = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
  record_small_request(op, bytes, route.nanoseconds, route.layer1, route.cold_direct);
  file.set_last_route(route);
  return bytes;
}

}  // namespace

namespace {

// The checks every small request makes before it runs; false (and nothing done) when it does
// not qualify. On true, the caller owes file.end_request().
bool start_small(OpenFile& file, Op op, void* buffer, std::size_t size, std::uint64_t offset,
                 std::size_t max_size, Settings* settings, cuda::QuickMemory* memory,
                 SmallRoute* route) {
  std::optional<Settings> s = small_settings(file, op, buffer, size, offset, max_size);
  if (!s) return false;
  *memory = cuda::classify_quick(buffer);
  std::optional<ReasonCode> layer1 = small_layer1(*s, *memory, size, file, &route->compat_why);
  if (!layer1) return false;
  route->layer1 = *layer1;
  try {
    file.begin_request(op == Op::kRead ? "pread" : "pwrite");
  } catch (const IoError&) {
    return false;  // closed: submit() reports it
  }
  *settings = *s;
  return true;
}

}  // namespace

bool run_small(OpenFile& file, Op op, void* buffer, std::size_t size, std::uint64_t offset,
               std::size_t max_size, std::size_t* bytes) {
  Settings settings;
  cuda::QuickMemory memory;
  SmallRoute route;
  if (!start_small(file, op, buffer, size, offset, max_size, &settings, &memory, &route)) {
    return false;
  }
  struct End {
    OpenFile& f;
    ~End() { f.end_request(); }
  } end{file};
  *bytes = run_small_now(file, op, buffer, size, offset, settings, memory, route);
  return true;
}

IoFuture submit_small(const std::shared_ptr<OpenFile>& file, Op op, void* buffer, std::size_t size,
                      std::uint64_t offset, std::size_t max_size) {
  Settings settings;
  cuda::QuickMemory memory;
  SmallRoute route;
  if (!start_small(*file, op, buffer, size, offset, max_size, &settings, &memory, &route)) {
    return IoFuture();
  }
  auto state = std::make_shared<RequestState>();
  try {
    std::size_t bytes = run_small_now(*file, op, buffer, size, offset, settings, memory, route);
    file->end_request();
    state->complete(bytes, file, route);
  } catch (...) {
    file->end_request();
    state->complete(0, std::current_exception(), small_report(*file, route));
  }
  return IoFuture(state);
}

RouteReport small_report(const OpenFile& file, const SmallRoute& r) {
  RouteReport report;
  report.op = r.op;
  report.file = file.path();
  report.memory = r.memory.kind;
  report.device = r.memory.device;
  report.offset = r.offset;
  report.requested = r.requested;
  report.bytes = r.bytes;
  report.tasks = 1;
  report.workers = 1;
  report.posix_tasks = 1;
  report.seconds = static_cast<double>(r.nanoseconds) / 1e9;
  report.page_cache = r.page_cache;
  if (!report.page_cache.known && report.page_cache.why_not.empty()) {
    report.page_cache.why_not = r.op == Op::kRead ? kSmallNotMeasured : "not measured for writes";
  }
  report.direct_tasks = r.cold_direct ? 1 : 0;
  const Settings& settings = r.settings;
  const MemoryInfo memory = cuda::with_note(r.memory);
  // The same rule, given the one fact it used (small_layer1 never needs the others).
  RouteFacts facts;
  facts.compat_only = [&r]() -> std::optional<std::string> {
    if (r.layer1 == ReasonCode::kCufileCompatOnly) return r.compat_why;
    return std::nullopt;
  };
  facts.probe_cufile = []() -> std::optional<std::string> { return "not probed"; };
  report.reasons = decide_route(settings, memory, r.requested, facts).reasons;
  std::atomic<bool> cancelled{false};
  std::atomic<std::size_t> direct_tasks{0};
  std::atomic<bool> cold_refused{false};
  RequestContext context{const_cast<OpenFile&>(file),
                         r.op,
                         nullptr,
                         memory,
                         settings,
                         cancelled,
                         1,
                         {},
                         direct_tasks,
                         cold_refused};
  report.reasons.push_back({ReasonCode::kEngine, posix_backend().describe(context)});
  if (r.cold_direct) report.reasons.push_back(cold_direct_reason(report));
  if (r.cold_refused) {
    report.reasons.push_back({ReasonCode::kDirectIoRefused, file.cold_direct_refused()});
  }
  report.cufile.why_not = "no request went to cuFile";
  return report;
}

}  // namespace ferry::core
