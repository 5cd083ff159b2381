#include "core/request.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/job.h"
#include "core/paths.h"
#include "core/request_plan.h"
#include "core/runtime_state.h"
#include "core/thread_pool.h"
#include "cuda/quick_memory.h"
#include "cuda/stream_order.h"
#include "ferry/error.h"
#include "io/io_seam.h"

namespace ferry::core {

namespace {
const bool fork_generation_counted = [] {
  pthread_atfork(nullptr, nullptr, [] { fork_generation.fetch_add(1, std::memory_order_relaxed); });
  return true;
}();

// A thread's spare blocks for objects of type T, each freed by a request's last reference in
// this thread and handed out again by make_request_state(). Trivially constructed, so that
// reaching it costs no guard; the Reaper frees the blocks when the thread exits. Per thread by
// design: a shared list would be one more cache line that every thread's requests write (§25).
template <typename T>
struct Spares {
  struct Block {
    Block* next;
  };
  static constexpr unsigned kMax = 16;
  Block* head = nullptr;
  unsigned count = 0;
  bool reaping = false;  // the Reaper is registered (or has run: then spares go to the heap)
  struct Reaper {
    ~Reaper();
  };
};
template <typename T>
constinit thread_local Spares<T> spares;

template <typename T>
Spares<T>::Reaper::~Reaper() {
  Spares<T>& s = spares<T>;
  while (s.head != nullptr) ::operator delete(std::exchange(s.head, s.head->next));
  s.count = kMax;  // blocks freed later in this thread's exit go to the heap
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)  // clang before 18 does not define __SANITIZE_ADDRESS__
#define FERRY_CLANG_ASAN 1
#endif
#endif
#ifndef FERRY_CLANG_ASAN
#define FERRY_CLANG_ASAN 0
#endif

// allocate_shared's allocator for request states: the thread's spares first, then the heap.
// Under AddressSanitizer every block comes from the heap, so that a use after free is caught.
template <typename T>
struct SpareAllocator {
  using value_type = T;
  SpareAllocator() = default;
  template <typename U>
  SpareAllocator(const SpareAllocator<U>&) {}
  T* allocate(std::size_t n) {
    Spares<T>& s = spares<T>;
    if (n == 1 && s.head != nullptr) {
      --s.count;
      return reinterpret_cast<T*>(std::exchange(s.head, s.head->next));
    }
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, [[maybe_unused]] std::size_t n) {
#if !defined(__SANITIZE_ADDRESS__) && !FERRY_CLANG_ASAN
    Spares<T>& s = spares<T>;
    if (n == 1 && s.count < Spares<T>::kMax) {
      if (!s.reaping) {
        s.reaping = true;
        static thread_local typename Spares<T>::Reaper reaper;
        (void)reaper;
      }
      s.head = new (p) typename Spares<T>::Block{s.head};
      ++s.count;
      return;
    }
#endif
    ::operator delete(p);
  }
  template <typename U>
  bool operator==(const SpareAllocator<U>&) const {
    return true;
  }
};

}  // namespace

std::shared_ptr<RequestState> make_request_state() {
  return std::allocate_shared<RequestState>(SpareAllocator<RequestState>());
}

void RequestState::throw_orphaned() const {
  throw IoError(ECANCELED, "request", "(of the parent process)", 0, 0, 0,
                "it was in flight in the parent at fork(); this child has none of the threads "
                "that ran it, so it never completes here (bytes_done unknown)");
}

void RequestState::complete(std::size_t bytes, std::exception_ptr error, RouteReport report) {
  auto made = std::make_unique<const RouteReport>(std::move(report));
  {
    std::lock_guard lock(mu_);
    bytes_ = bytes;
    error_ = std::move(error);
    report_ = std::move(made);
    done_ = true;
    finished_.store(true, std::memory_order_release);
    if (cv_) cv_->notify_all();
  }
}

bool RequestState::ready() const {
  if (finished_.load(std::memory_order_acquire) || orphaned()) return true;
  std::lock_guard lock(mu_);
  return done_;
}

void RequestState::wait() const {
  if (finished_.load(std::memory_order_acquire) || orphaned()) return;
  if (helper_) helper_();
  std::unique_lock lock(mu_);
  if (done_) return;
  if (!cv_) cv_.emplace();
  cv_->wait(lock, [this] { return done_; });
}

bool RequestState::wait_for(double seconds) const {
  if (finished_.load(std::memory_order_acquire) || orphaned()) return true;
  std::unique_lock lock(mu_);
  if (done_) return true;
  if (!cv_) cv_.emplace();
  return cv_->wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; });
}

std::size_t RequestState::get() const {
  wait();
  // wait() returns before the result only for a request orphaned by fork().
  if (!finished_.load(std::memory_order_acquire)) throw_orphaned();
  if (error_) std::rethrow_exception(error_);
  return bytes_;
}

void RequestState::complete_unshared(std::size_t bytes, const std::string& path) {
  bytes_ = bytes;
  if (path.size() <= sizeof(small_path_inline_)) {
    small_path_size_ = static_cast<std::uint16_t>(path.size());
    std::memcpy(small_path_inline_, path.data(), path.size());
  } else {
    small_path_ = path;
  }
  done_ = true;
  finished_.store(true, std::memory_order_release);
}

bool RequestState::cancel() {
  if (finished_.load(std::memory_order_acquire) || orphaned()) return false;
  std::lock_guard lock(mu_);
  if (done_) return false;
  cancel_requested_.store(true, std::memory_order_relaxed);
  stop_.store(true, std::memory_order_relaxed);
  return true;
}

RouteReport RequestState::route() const {
  wait();
  if (!finished_.load(std::memory_order_acquire)) throw_orphaned();
  // A failed small request's report was made when it failed (complete()).
  if (report_) return *report_;
  if (!small_path_.empty()) return small_report(small_path_, *small_);
  return small_report(std::string(small_path_inline_, small_path_size_), *small_);
}

namespace {

// A request as the engine receives it: one range into one buffer, or a gathered read.
struct RequestSpec {
  Op op = Op::kRead;
  void* buffer = nullptr;
  std::uint64_t offset = 0;
  std::size_t size = 0;
  std::span<const ReadRange> ranges;  // a gathered read: buffer, offset and size are derived
  bool gathered = false;
  // A gathered read into one buffer (pread_ranges): classified once, and the ranges the caller
  // gave before adjacent ones were coalesced.
  const void* one_buffer = nullptr;
  std::size_t ranges_given = 0;
  // A stream-ordered request on this CUstream (File::read_async).
  bool stream_ordered = false;
  void* stream = nullptr;
};

void check_range(const OpenFile& file, Op op, const void* buffer, std::uint64_t offset,
                 std::size_t size) {
  if (buffer == nullptr && size > 0) {
    throw IoError(EFAULT, to_string(op), file.path(), offset, size, 0, "null buffer");
  }
  if (offset > static_cast<std::uint64_t>(LLONG_MAX) ||
      size > static_cast<std::uint64_t>(LLONG_MAX) - offset) {
    throw IoError(EOVERFLOW, to_string(op), file.path(), offset, size, 0,
                  "offset + size overflows off_t");
  }
}

const char* gathered_name(Op op) { return op == Op::kRead ? "pread_gather" : "pwrite_scatter"; }

// A scattered write's ranges must not overlap in the file: its tasks run in any order, so the
// bytes of an overlap would be whichever task came last. Throws naming two that overlap.
void check_no_overlap(const OpenFile& file, std::span<const ReadRange> ranges) {
  std::vector<std::size_t> order;
  order.reserve(ranges.size());
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].size > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return ranges[a].file_offset < ranges[b].file_offset;
  });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const ReadRange& before = ranges[order[k - 1]];
    const ReadRange& r = ranges[order[k]];
    if (before.file_offset + before.size > r.file_offset) {
      const std::size_t a = std::min(order[k - 1], order[k]);
      const std::size_t b = std::max(order[k - 1], order[k]);
      throw IoError(EINVAL, "pwrite_scatter", file.path(), r.file_offset, r.size, 0,
                    fmt::format("range {} (file bytes [{}, {})) overlaps range {} ([{}, {})): "
                                "the ranges of one scattered write must not overlap",
                                a, ranges[a].file_offset, ranges[a].file_offset + ranges[a].size, b,
                                ranges[b].file_offset, ranges[b].file_offset + ranges[b].size));
    }
  }
}

// The tasks of a gathered read or a scattered write, after checking every range (a read's inside
// the file, a write's apart from each other); sets the spec's envelope (lowest offset, lowest
// buffer address, total bytes). Ranges of zero bytes are skipped.
RequestTasks gather_tasks(OpenFile& file, RequestSpec& spec, std::size_t task_size) {
  const bool read = spec.op == Op::kRead;
  const std::uint64_t file_size = read ? file.size() : 0;
  std::uintptr_t base = UINTPTR_MAX;
  std::uint64_t low = UINT64_MAX;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < spec.ranges.size(); ++i) {
    const ReadRange& r = spec.ranges[i];
    if (r.size == 0) continue;
    check_range(file, spec.op, r.buffer, r.file_offset, r.size);
    if (read && r.file_offset + r.size > file_size) {
      throw IoError(ENXIO, "pread_gather", file.path(), r.file_offset, r.size, 0,
                    fmt::format("range {} ends at {}, past the end of the file ({} B)", i,
                                r.file_offset + r.size, file_size));
    }
    base = std::min(base, reinterpret_cast<std::uintptr_t>(r.buffer));
    low = std::min(low, r.file_offset);
    total += r.size;
  }
  if (!read) check_no_overlap(file, spec.ranges);
  std::vector<Task> list;
  // Ranges into one buffer (pread_ranges) lie in one allocation; ranges of their own buffers
  // (pread_gather) each name theirs (Task::range).
  const bool own_buffers = spec.one_buffer == nullptr;
  for (std::size_t i = 0; i < spec.ranges.size(); ++i) {
    const ReadRange& r = spec.ranges[i];
    const std::size_t at = reinterpret_cast<std::uintptr_t>(r.buffer) - base;
    for (std::size_t done = 0; done < r.size; done += task_size) {
      list.push_back(Task{r.file_offset + done, at + done, std::min(task_size, r.size - done),
                          own_buffers ? i : 0});
    }
  }
  spec.buffer = list.empty() ? nullptr : reinterpret_cast<void*>(base);
  spec.offset = list.empty() ? 0 : low;
  spec.size = total;
  return RequestTasks(std::move(list), total);
}

// Every buffer of a gathered read (or a scattered write) must be memory of one kind on one
// device: the workers stage and copy for one. Returns that kind.
MemoryInfo classify_gathered(const OpenFile& file, const RequestSpec& spec) {
  if (spec.one_buffer != nullptr) return classify_memory(spec.one_buffer);
  MemoryInfo first;
  const void* last = nullptr;
  for (std::size_t i = 0; i < spec.ranges.size(); ++i) {
    const ReadRange& r = spec.ranges[i];
    if (r.size == 0 || r.buffer == last) continue;
    MemoryInfo m = classify_memory(r.buffer);
    if (last == nullptr) {
      first = std::move(m);
    } else if (m.kind != first.kind || m.device != first.device) {
      const bool read = spec.op == Op::kRead;
      throw IoError(EINVAL, gathered_name(spec.op), file.path(), r.file_offset, r.size, 0,
                    fmt::format("range {} {} {} memory (device {}) but range 0 {} {} (device "
                                "{}): one request moves bytes {} one kind of memory",
                                i, read ? "reads into" : "writes from", to_string(m.kind), m.device,
                                read ? "into" : "from", to_string(first.kind), first.device,
                                read ? "into" : "from"));
    }
    last = r.buffer;
  }
  return first;
}

// A request with everything decided about it before any I/O: its checks passed, its settings,
// its memory, its tasks, its route (the one plan) and the report's skeleton.
struct PlannedRequest {
  RouteReport report;  // filled as the plan is made: a request that fails early reports this
  Settings settings;
  MemoryInfo memory;        // the buffer's memory
  MemoryInfo route_memory;  // the memory layer 1 decides on (differs only under a test double)
  // A stream-ordered request on GPU memory moves its bytes between the file and pinned staging
  // of its own, on ferry's POSIX path; its stream copies (cuda/stream_order.h).
  bool staged = false;
  std::size_t effective = 0;  // the bytes it moves: a read stops at the end of the file
  std::optional<RequestTasks> tasks;
  RequestPlan route;  // layer 1, with the cuFile path's backend where it probed it
};

void check_access(const OpenFile& file, const RequestSpec& spec) {
  if (spec.op == Op::kRead && !file.readable()) {
    throw IoError(EBADF, "pread", file.path(), spec.offset, spec.size, 0,
                  "file not opened for reading");
  }
  if (spec.op == Op::kWrite && !file.writable()) {
    throw IoError(EBADF, "pwrite", file.path(), spec.offset, spec.size, 0,
                  "file not opened for writing");
  }
}

// The span of the file a request covers: its bytes, or for a gathered read (a scattered write)
// the span from its first byte to its last. A read measures residency over it; a write may
// allocate it ahead.
std::uint64_t request_span(const RequestSpec& spec, std::size_t effective) {
  if (!spec.gathered) return effective;
  std::uint64_t span = 0;
  for (const ReadRange& r : spec.ranges) {
    if (r.size > 0) span = std::max<std::uint64_t>(span, r.file_offset + r.size - spec.offset);
  }
  return span;
}

// Makes the plan of a request (the file's request begun by the caller); throws what the
// request fails with before I/O, `plan.report` holding what was known by then.
void plan_request(OpenFile& file, RequestSpec& spec, PlannedRequest& plan) {
  RouteReport& report = plan.report;
  if (!spec.gathered) check_range(file, spec.op, spec.buffer, spec.offset, spec.size);
  check_access(file, spec);
  plan.settings = file.settings();
  if (spec.gathered) {
    plan.tasks.emplace(gather_tasks(file, spec, plan.settings.task_size));
    report.offset = spec.offset;
    report.requested = spec.size;
    report.runs = 0;
    for (const ReadRange& r : spec.ranges) report.runs += r.size > 0 ? 1 : 0;
    report.ranges = spec.one_buffer != nullptr ? spec.ranges_given : report.runs;
  }
  plan.memory = spec.gathered ? classify_gathered(file, spec) : classify_memory(spec.buffer);
  plan.staged = spec.stream_ordered && is_gpu(plan.memory.kind);
  if (plan.staged && plan.settings.require != Require::kAny) {
    throw RouteError(fmt::format(
        "{} {} offset={} len={}: {}={} refuses ferry's POSIX path, and a stream-ordered "
        "request on GPU memory takes it (pinned staging, copied on the stream; "
        "cuFileReadAsync is not used); call read/write, or let the route be chosen",
        spec.op == Op::kRead ? "read_async" : "write_async", file.path(), spec.offset, spec.size,
        "require", to_string(plan.settings.require)));
  }
  const MemoryInfo staging_memory{MemoryKind::kHostPinned, plan.memory.device, {}};
  plan.route_memory = file.runtime().env().layer1_view(plan.staged ? staging_memory : plan.memory);
  report.memory = plan.memory.kind;
  report.device = plan.memory.device;
  report.direct = file.direct_fd() >= 0;
  plan.effective = spec.size;
  if (spec.op == Op::kRead && !spec.gathered) {
    const std::uint64_t file_size = file.size();
    plan.effective =
        spec.offset >= file_size ? 0 : std::min<std::uint64_t>(spec.size, file_size - spec.offset);
  }
  if (!plan.tasks) plan.tasks.emplace(spec.offset, plan.effective, plan.settings.task_size);
  plan.route = plan_route(plan.settings, plan.route_memory, plan.effective,
                          {&file, spec.op, spec.offset, request_span(spec, plan.effective), {}});
  report.page_cache = plan.route.residency;
  report.reasons = plan.route.reasons;
  if (plan.route.refusal) throw RouteError(*plan.route.refusal);
  if (file.direct_requested() && file.direct_fd() < 0) {
    report.reasons.push_back({ReasonCode::kDirectIoRefused, file.direct_refused()});
  }
}

// The words of a stream-ordered request's engine, after its backend's.
std::string stream_order_words(const Job& job, const RequestSpec& spec, int device) {
  if (job.order) {
    return fmt::format(
        "; stream-ordered on stream {}: started by the stream once the work queued on it "
        "before the call has run, on workers of its own; the work queued after waits for a "
        "flag set once the last byte is in place",
        fmt::ptr(spec.stream));
  }
  if (job.staged && spec.op == Op::kRead) {
    return fmt::format(
        "; stream-ordered on stream {}: read into pinned staging of its own from the call "
        "on, on workers of its own; the stream copies each task to GPU {} once it is "
        "staged (a wait for a flag, then the copy, queued on the stream at the call), after "
        "the work queued before the call and before the work queued after",
        fmt::ptr(spec.stream), device);
  }
  if (job.staged) {
    return fmt::format(
        "; stream-ordered on stream {}: the stream copies the buffer from GPU {} into pinned "
        "staging of its own after the work queued before the call (the work queued after "
        "may then change the buffer), then starts the writes from the staging, on workers "
        "of its own",
        fmt::ptr(spec.stream), device);
  }
  return {};
}

// The job that runs a plan: its backend, its staging where stream-ordered, its workers, and the
// report completed with the engine's words.
std::shared_ptr<Job> make_job(const std::shared_ptr<OpenFile>& file,
                              const std::shared_ptr<RequestState>& state, const RequestSpec& spec,
                              PlannedRequest& plan) {
  const Op op = spec.op;
  const bool cufile = plan.route.path == Path::kCufile;
  std::shared_ptr<Backend> cufile_backend = cufile ? std::move(plan.route.probe.backend) : nullptr;
  const Environment& env = file->runtime().env();
  Backend* backend = cufile ? cufile_backend.get() : env.host;
  const MemoryInfo staging_memory{MemoryKind::kHostPinned, plan.memory.device, {}};
  std::shared_ptr<cuda::StagedCopies> staged_copies;
  if (plan.staged && plan.tasks->count() > 0) {
    std::vector<cuda::StagedCopies::Piece> pieces(plan.tasks->count());
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const Task t = (*plan.tasks)[i];
      pieces[i] = {t.buffer_offset, t.size};
    }
    staged_copies = std::make_shared<cuda::StagedCopies>(
        static_cast<cuda::abi::Stream>(spec.stream), plan.memory.device,
        op == Op::kRead ? cuda::StagedCopies::Direction::kToDevice
                        : cuda::StagedCopies::Direction::kFromDevice,
        reinterpret_cast<cuda::abi::DevicePtr>(spec.buffer), plan.tasks->bytes(),
        std::move(pieces));
  }
  auto job = std::make_shared<Job>(
      file, state, backend, op,
      staged_copies ? staged_copies->staging() : static_cast<char*>(spec.buffer),
      staged_copies ? staging_memory : plan.memory, plan.settings, std::move(*plan.tasks));
  job->staged = staged_copies;
  if (staged_copies && op == Op::kRead) job->parts_left = 2;
  if (spec.stream_ordered && !plan.staged && job->tasks.count() > 0) {
    job->order =
        std::make_unique<cuda::StreamOrder>(static_cast<cuda::abi::Stream>(spec.stream), -1);
  }
  job->owned_backend = std::move(cufile_backend);
  job->compat_refused = plan.route.probe.compat_refused;
  job->residency = plan.report.page_cache;
  job->context.residency = &job->residency;
  RouteReport& report = plan.report;
  report.tasks = job->tasks.count();
  // A request runs up to workers_for() jobs (nthreads for GPU memory). The pool a GPU request's
  // jobs queue on may grow to the larger thread setting, so that GPU requests in flight together
  // (a load's parts) have the same threads in every process: it used to reach 16 only after a
  // host request or warm_up(), and Python's GPU loads, without either, shared 8 threads at 34
  // GB/s where the CLI's ran at 46 (bench/NOTES.md §27). Host requests keep host_nthreads.
  const bool gpu = is_gpu(plan.route_memory.kind);
  const std::size_t per_request = workers_for(plan.settings, gpu, job->file->remote());
  job->threads = gpu ? std::max(per_request, plan.settings.host_nthreads) : per_request;
  // A server that ignores Range answers every ranged GET with the whole object: the tasks run
  // in order on one worker, so that one GET streams them all (src/remote/remote_seam.cc); so
  // do those of the first read from a server that has not said, whose GET tells.
  const std::optional<io::RangeSupport> ranges =
      job->file->remote() ? job->file->io().range_support(job->file->fd()) : std::nullopt;
  const bool in_order = ranges && ranges->kind != io::RangeSupport::Kind::kServed;
  const std::size_t jobs = in_order ? 1
                                    : std::min({per_request, std::max<std::size_t>(report.tasks, 1),
                                                backend->max_workers(job->context)});
  job->context.workers = jobs;
  job->claim = claim_for(job->tasks.count(), job->expected, jobs);
  report.workers = report.tasks == 0 ? 0 : jobs;
  std::string engine =
      backend->describe(job->context) + stream_order_words(*job, spec, plan.memory.device);
  if (op == Op::kWrite && backend == env.host) {
    const std::string ahead =
        env.host->prepare_write(*file, spec.offset, request_span(spec, plan.effective));
    if (!ahead.empty()) engine += "; " + ahead;
    if (file->write_behind() && file->direct_fd() < 0) {
      engine +=
          "; write-behind: each write's pages sent on to the disk as written "
          "(sync_file_range), so the fsync after waits for the last only";
    }
  }
  if (in_order && report.tasks > 0) {
    engine += fmt::format(
        "; the tasks run in order on one worker, their bytes streamed from one GET (from a "
        "whole-object answer, the bytes before them received and discarded, the transfer cut "
        "after the last), not ranged GETs at once: {} ({})",
        ranges->kind == io::RangeSupport::Kind::kIgnored
            ? "the server ignores Range"
            : "the server has not said whether it serves ranges, and this GET's answer tells",
        ranges->basis);
  }
  report.reasons.push_back({ReasonCode::kEngine, std::move(engine)});
  if (cufile) {
    report.cufile_tasks = report.tasks;
  } else {
    report.posix_tasks = report.tasks;
    report.cufile.why_not = "no request went to cuFile";
  }
  job->report = report;
  // Last before the first task runs, so the window holds this request's cuFile calls only.
  if (cufile) job->observation = env.accelerated->observe(op, plan.route_memory.device);
  if (file->remote()) job->source = file->io().observe_source(file->fd());
  return job;
}

// Starts a made job: from here it completes (and ends what it started) whatever happens.
void start_job(const std::shared_ptr<Job>& job, const std::shared_ptr<RequestState>& state) {
  const bool ordered = job->order || job->staged;
  ThreadPool& pool = ordered ? job->file->runtime().ordered_pool() : job->file->runtime().pool();
  job->thread_pool = &pool;
  const std::size_t jobs = job->context.workers;
  if (job->tasks.count() > 0) pool.ensure_threads(jobs);
  job->file->runtime().env().note_request_started(job->expected);
  if (job->tasks.count() == 0) {
    job->jobs_left = 1;
    job->complete();
    return;
  }
  job->jobs_left = jobs;
  // Each job queued may grow the pool to the jobs running and queued, up to nthreads: other
  // callers' requests share it.
  auto run_jobs = [job, jobs] {
    job->thread_pool->note_request_queued();
    for (std::size_t j = 0; j < jobs; ++j) {
      job->thread_pool->submit([job] { job->start_one(); }, job->threads);
    }
  };
  // One task on host memory, to be waited for at once more often than not: the wait runs it
  // unless a worker has started it (bench/NOTES.md §19). GPU memory keeps its workers, whose
  // threads hold the device's context and staging.
  if (!ordered && jobs == 1 && job->tasks.count() == 1 &&
      job->backend == job->file->runtime().env().host && !is_gpu(job->context.memory.kind)) {
    job->helpable = true;
    job->unstarted = 1;
    state->set_helper([weak = std::weak_ptr<Job>(job)] {
      if (auto j = weak.lock()) j->help();
    });
  }
  if (!ordered) {
    run_jobs();
    return;
  }
  try {
    if (job->order) {
      // The stream starts the jobs once its earlier work has run (in a CUDA thread).
      job->order->begin(std::move(run_jobs));
    } else if (job->context.op == Op::kRead) {
      // The copies wait on the stream for each task to be staged: the jobs start now.
      cuda::StagedCopies::queue(job->staged, [job] { job->copies_done(); });
      run_jobs();
    } else {
      // The stream copies the buffer out, then starts the writes.
      cuda::StagedCopies::queue(job->staged, std::move(run_jobs));
    }
  } catch (...) {
    // Nothing was started and no copy will call back: complete here, once.
    job->fail(std::current_exception(), SIZE_MAX, 0);
    job->jobs_left = 1;
    job->parts_left = 1;
    job->complete();
  }
}

// A request: its plan, then its run. Errors before any I/O complete the future at once.
IoFuture submit_spec(std::shared_ptr<OpenFile> file, RequestSpec spec) {
  auto state = make_request_state();
  if (spec.stream_ordered) state->set_stream_ordered();
  IoFuture future(state);
  const Environment& env = file->runtime().env();
  const Clock::time_point start = env.now();
  PlannedRequest plan;
  plan.report.op = spec.op;
  plan.report.file = file->path();
  plan.report.offset = spec.offset;
  plan.report.requested = spec.size;
  bool registered = false;  // begin_request() succeeded: end_request() is owed
  try {
    file->begin_request(spec.op == Op::kRead ? "pread" : "pwrite");
    registered = true;
    plan_request(*file, spec, plan);
    std::shared_ptr<Job> job = make_job(file, state, spec, plan);
    job->start = start;
    start_job(job, state);
  } catch (...) {
    // Before the job started: nothing ran, nothing will.
    if (registered) file->end_request();
    env.record_request(plan.report, true);
    state->complete(0, std::current_exception(), plan.report);
  }
  return future;
}

}  // namespace

namespace {
// One range into (from) one buffer.
RequestSpec one_range(Op op, void* buffer, std::size_t size, std::uint64_t offset) {
  RequestSpec spec;
  spec.op = op;
  spec.buffer = buffer;
  spec.offset = offset;
  spec.size = size;
  return spec;
}
}  // namespace

IoFuture submit(std::shared_ptr<OpenFile> file, Op op, void* buffer, std::size_t size,
                std::uint64_t offset) {
  return submit_spec(std::move(file), one_range(op, buffer, size, offset));
}

IoFuture submit_stream_ordered(std::shared_ptr<OpenFile> file, Op op, void* buffer,
                               std::size_t size, std::uint64_t offset, void* stream) {
  RequestSpec spec = one_range(op, buffer, size, offset);
  spec.stream_ordered = true;
  spec.stream = stream;
  return submit_spec(std::move(file), spec);
}

IoFuture submit_gather(std::shared_ptr<OpenFile> file, std::span<const ReadRange> ranges,
                       const void* one_buffer, std::size_t ranges_given, Op op) {
  RequestSpec spec;
  spec.op = op;
  spec.ranges = ranges;
  spec.gathered = true;
  spec.one_buffer = one_buffer;
  spec.ranges_given = ranges_given;
  for (const ReadRange& r : ranges)
    spec.size += r.size;  // for errors before the ranges are checked
  return submit_spec(std::move(file), spec);
}

}  // namespace ferry::core
