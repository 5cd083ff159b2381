#include "core/request.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <span>
#include <vector>

#include "core/backend.h"
#include "core/paths.h"
#include "core/route_facts.h"
#include "core/routing.h"
#include "core/runtime_state.h"
#include "core/stats_recorder.h"
#include "core/task_splitter.h"
#include "core/thread_pool.h"
#include "cuda/quick_memory.h"
#include "cuda/stream_order.h"
#include "ferry/error.h"

namespace ferry::core {
namespace {
const bool fork_generation_counted = [] {
  pthread_atfork(nullptr, nullptr, [] { fork_generation.fetch_add(1, std::memory_order_relaxed); });
  return true;
}();
}  // namespace

void RequestState::throw_orphaned() const {
  throw IoError(ECANCELED, "request", "(of the parent process)", 0, 0, 0,
                "it was in flight in the parent at fork(); this child has none of the threads "
                "that ran it, so it never completes here (bytes_done unknown)");
}

void RequestState::complete(std::size_t bytes, std::exception_ptr error, RouteReport report) {
  {
    std::lock_guard lock(mu_);
    bytes_ = bytes;
    error_ = std::move(error);
    report_ = std::move(report);
    done_ = true;
    finished_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
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
  cv_.wait(lock, [this] { return done_; });
}

bool RequestState::wait_for(double seconds) const {
  if (finished_.load(std::memory_order_acquire) || orphaned()) return true;
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; });
}

std::size_t RequestState::get() const {
  wait();
  // wait() returns before the result only for a request orphaned by fork().
  if (!finished_.load(std::memory_order_acquire)) throw_orphaned();
  if (error_) std::rethrow_exception(error_);
  return bytes_;
}

void RequestState::complete_unshared(std::size_t bytes, const std::string& path,
                                     const SmallRoute& route) {
  bytes_ = bytes;
  small_path_ = path;
  small_ = route;
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
  if (small_) return small_report(small_path_, *small_);
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

// The tasks of a request: one range cut by the task splitter, or the pieces of a gathered read
// (each range cut the same way), whose buffer offsets count from the lowest buffer address.
class RequestTasks {
 public:
  RequestTasks(std::uint64_t offset, std::size_t size, std::size_t task_size)
      : splitter_(offset, size, task_size), bytes_(size) {}
  RequestTasks(std::vector<Task> list, std::uint64_t bytes)
      : splitter_(0, 0, 1), list_(std::move(list)), gathered_(true), bytes_(bytes) {}
  std::size_t count() const { return gathered_ ? list_.size() : splitter_.count(); }
  Task operator[](std::size_t i) const { return gathered_ ? list_[i] : splitter_[i]; }
  bool gathered() const { return gathered_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  TaskSplitter splitter_;
  std::vector<Task> list_;
  bool gathered_ = false;
  std::uint64_t bytes_;
};

// Everything the pool jobs of one request share.
struct Job : std::enable_shared_from_this<Job> {
  std::shared_ptr<OpenFile> file;
  std::shared_ptr<RequestState> state;
  Backend* backend;
  std::atomic<bool>& cancelled;  // the state's stop flag: a task failed, or cancel() was called
  std::atomic<std::size_t> direct_tasks{0};
  std::atomic<bool> cold_refused{false};
  RequestContext context;
  RequestTasks tasks;
  const bool gathered;
  const std::uint64_t expected;   // the bytes of all tasks
  std::vector<std::size_t> done;  // bytes moved per task; each slot written by one job
  std::atomic<std::size_t> next{0};
  // Tasks a job takes at once: consecutive small tasks (rows of a gathered read) go to one
  // worker, which can copy adjacent ones together (posix_backend.cc); else 1.
  std::size_t claim = 1;
  std::atomic<std::size_t> jobs_left{0};
  std::atomic<bool> begun{false};  // a job of this request has run (the pool was told)
  // A request of one task on host memory: its one job, queued on the pool, is run by whichever
  // comes first, a worker or the caller's wait (RequestState::set_helper). `unstarted` is 1
  // until one of them takes it.
  bool helpable = false;
  std::atomic<int> unstarted{0};
  std::mutex error_mu;
  std::exception_ptr error;  // the first failure
  std::size_t failed_task = SIZE_MAX;
  std::uint64_t partial = 0;  // bytes the failing task moved before it failed
  RouteReport report;
  Clock::time_point start;
  // The cuFile path only: the backend holding the file's handle, and layer 2's window.
  std::shared_ptr<Backend> owned_backend;
  std::unique_ptr<Layer2Window> observation;
  bool compat_refused = false;  // cuFile's driver was opened with compatibility refused
  // A stream-ordered request on host memory: the stream's later work waits until complete()
  // releases it.
  std::unique_ptr<cuda::StreamOrder> order;
  // A stream-ordered request on GPU memory: the workers read into (write from) its staging, and
  // the stream copies. A read completes once both its jobs and the stream's copies are done
  // (copies_done(), from the stream): the second to finish completes the future.
  std::shared_ptr<cuda::StagedCopies> staged;
  std::atomic<int> parts_left{1};
  std::size_t result_bytes = 0;
  std::exception_ptr result_error;
  ThreadPool* thread_pool = nullptr;  // the runtime's pool(), or ordered_pool() (stream-ordered)

  Job(std::shared_ptr<OpenFile> f, std::shared_ptr<RequestState> s, Backend* b, Op op, char* buffer,
      MemoryInfo memory, Settings settings, RequestTasks t)
      : file(std::move(f)),
        state(std::move(s)),
        backend(b),
        cancelled(state->stop_flag()),
        context{*file,     op, buffer, std::move(memory), settings,
                cancelled, 1,  {},     direct_tasks,      cold_refused},
        tasks(std::move(t)),
        gathered(tasks.gathered()),
        expected(tasks.bytes()),
        done(tasks.count(), 0) {
    context.gathered = gathered;
  }

  // `task` is the index of the failing task (SIZE_MAX when the failure was not a task's) and
  // `moved` the bytes it had moved, a prefix of it.
  void fail(std::exception_ptr e, std::size_t task, std::uint64_t moved) {
    std::lock_guard lock(error_mu);
    if (!error) {
      error = std::move(e);
      failed_task = task;
      partial = moved;
    }
    cancelled.store(true, std::memory_order_relaxed);
  }

  // The bytes known to be in place from the request's start: whole tasks up to the first that is
  // short or did not run, plus what the failing task moved when it is that one. A resumable
  // prefix, unlike the sum (tasks after a gap may have completed too).
  std::uint64_t prefix_done() const {
    std::uint64_t bytes = 0;
    for (std::size_t i = 0; i < tasks.count(); ++i) {
      if (done[i] == tasks[i].size) {
        bytes += done[i];
        continue;
      }
      return bytes + (i == failed_task ? partial : done[i]);
    }
    return bytes;
  }

  // One job: takes tasks until none is left. Between tasks it yields to jobs that wait in the
  // pool: at once to a request that has not started (it would otherwise wait for this whole
  // request), and to other requests' continuations once it has held its thread for a turn
  // (kTurn). A yield completes the work in flight and queues the continuation behind them; it
  // finishes the worker (for GPU memory: waits for its copies and gives back its staging), which
  // after every task would stop each copy from overlapping the next task's read (bench/NOTES.md
  // §15), hence the turn.
  // A worker that looks ahead (Worker::looks_ahead) is told the task it runs next while it runs
  // one: the next of its run, or the first of the next run, which it then claims before the
  // last task of this run ends; never while it means to yield, so a yield strands no claim.
  static constexpr std::chrono::milliseconds kTurn{10};
  bool take_unstarted() {
    int n = 1;
    return unstarted.compare_exchange_strong(n, 0, std::memory_order_acq_rel);
  }
  // A job as queued on the pool (continuations after a yield call run_one).
  void start_one() {
    if (helpable && !take_unstarted()) return;  // the caller's wait ran it
    run_one();
  }
  void help() {
    if (take_unstarted()) run_one();
  }
  void run_one() {
    ThreadPool& pool = *thread_pool;
    if (!begun.exchange(true, std::memory_order_relaxed)) pool.note_request_started();
    const Clock::time_point turn_start = Clock::now();
    auto time_to_yield = [&] {
      return pool.waiting() > 0 && next.load(std::memory_order_relaxed) < tasks.count() &&
             (pool.requests_waiting_to_start() || Clock::now() - turn_start >= kTurn);
    };
    try {
      std::unique_ptr<Worker> worker = backend->make_worker(context);
      const bool look_ahead = worker->looks_ahead();
      std::size_t ahead = SIZE_MAX;  // the first task of the run claimed next, when looking ahead
      for (;;) {
        if (cancelled.load(std::memory_order_relaxed)) break;
        const std::size_t first =
            ahead != SIZE_MAX ? ahead : next.fetch_add(claim, std::memory_order_relaxed);
        ahead = SIZE_MAX;
        if (first >= tasks.count()) break;
        const std::size_t last = std::min(first + claim, tasks.count());
        bool failed = false;
        for (std::size_t i = first; i < last; ++i) {
          if (i > first && cancelled.load(std::memory_order_relaxed)) break;
          std::size_t then = SIZE_MAX;
          if (look_ahead && i + 1 < last) {
            then = i + 1;
          } else if (look_ahead && !time_to_yield()) {
            const std::size_t n = next.fetch_add(claim, std::memory_order_relaxed);
            if (n < tasks.count()) then = ahead = n;
          }
          try {
            done[i] =
                then != SIZE_MAX ? worker->run_then(tasks[i], tasks[then]) : worker->run(tasks[i]);
            if (staged) staged->staged(i);
            state->add_progress(done[i]);
          } catch (const IoError& e) {
            fail(std::current_exception(), i, e.bytes_done());
            failed = true;
            break;
          }
        }
        if (failed) break;
        if (ahead == SIZE_MAX && time_to_yield()) {
          worker->finish();
          worker.reset();
          pool.submit([job = shared_from_this()] { job->run_one(); });
          return;
        }
      }
      worker->finish();
    } catch (...) {
      fail(std::current_exception(), SIZE_MAX, 0);
    }
    if (jobs_left.fetch_sub(1, std::memory_order_acq_rel) == 1) complete();
  }

  // Runs once, after every job is done.
  void complete() {
    std::size_t bytes = 0;
    std::exception_ptr e = error;
    if (!e && state->cancel_requested() && prefix_done() < expected) {
      // Stopped early without a failure: the caller cancelled the request.
      e = std::make_exception_ptr(IoError(ECANCELED, to_string(context.op), file->path(),
                                          report.offset, report.requested, 0,
                                          "cancelled; bytes_done counts the bytes in place"));
    }
    if (context.op == Op::kRead && !gathered) {
      // A read is the contiguous prefix up to the first task cut short by end of file.
      for (std::size_t i = 0; i < tasks.count(); ++i) {
        bytes += done[i];
        if (done[i] < tasks[i].size) break;
      }
    } else {
      for (std::size_t d : done) bytes += d;
      if (!e && context.op == Op::kRead && bytes < report.requested) {
        // Every range was inside the file when the request began: it shrank since.
        e = std::make_exception_ptr(IoError(EIO, "pread_gather", file->path(), report.offset,
                                            report.requested, prefix_done(),
                                            "the file ended inside a gathered range (it shrank "
                                            "while the request ran)"));
      }
    }
    report.bytes = bytes;
    report.direct_tasks = direct_tasks.load();
    if (report.direct_tasks > 0) report.reasons.push_back(cold_direct_reason(report));
    if (cold_refused.load()) {
      report.reasons.push_back({ReasonCode::kDirectIoRefused, file->cold_direct_refused()});
    }
    report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (observation) {
      observation->end(report.cufile);
      observation.reset();
      auto refusal =
          refuse_layer2(context.settings, report, compat_refused, &report.cufile.unjudged);
      if (refusal && !e) {
        e = std::make_exception_ptr(RouteError(*refusal));
      }
    }
    if (e) {
      const std::uint64_t moved = prefix_done();
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
    note_request_ended(expected);
    file->set_last_route(report);
    file->end_request();
    // Drop the file before the caller can see completion: pool threads keep this Job alive a
    // little longer, and the file (with its I/O seam) must not outlive what the caller awaits.
    file.reset();
    // Every copy has completed (each worker synchronised its stream): the stream may go on.
    if (order) order->release();
    if (staged) staged->release_all();
    result_bytes = bytes;
    result_error = std::move(e);
    finish_part();
  }

  // A staged read's copies have run on its stream.
  void copies_done() { finish_part(); }

 private:
  void finish_part() {
    if (parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      state->complete(result_bytes, result_error, report);
    }
  }
};

// Small tasks are taken in runs of consecutive ones when there are many more than workers:
// enough runs per worker (16) for the last ones to balance, at most 256 tasks each.
std::size_t claim_for(std::size_t tasks, std::uint64_t bytes, std::size_t workers) {
  constexpr std::uint64_t kSmallTask = 64 << 10;
  if (tasks == 0 || bytes / tasks > kSmallTask) return 1;
  return std::clamp<std::size_t>(tasks / (std::max<std::size_t>(workers, 1) * 16), 1, 256);
}

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

IoFuture submit_spec(std::shared_ptr<OpenFile> file, RequestSpec spec) {
  auto state = std::make_shared<RequestState>();
  if (spec.stream_ordered) state->set_stream_ordered();
  IoFuture future(state);
  Clock::time_point start = Clock::now();
  const Op op = spec.op;
  RouteReport report;
  report.op = op;
  report.file = file->path();
  report.offset = spec.offset;
  report.requested = spec.size;
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
    if (!spec.gathered) check_range(*file, op, spec.buffer, spec.offset, spec.size);
    if (op == Op::kRead && !file->readable()) {
      throw IoError(EBADF, "pread", file->path(), spec.offset, spec.size, 0,
                    "file not opened for reading");
    }
    if (op == Op::kWrite && !file->writable()) {
      throw IoError(EBADF, "pwrite", file->path(), spec.offset, spec.size, 0,
                    "file not opened for writing");
    }
    Settings settings = file->settings();
    std::optional<RequestTasks> tasks;
    if (spec.gathered) {
      tasks.emplace(gather_tasks(*file, spec, settings.task_size));
      report.offset = spec.offset;
      report.requested = spec.size;
      report.runs = 0;
      for (const ReadRange& r : spec.ranges) report.runs += r.size > 0 ? 1 : 0;
      report.ranges = spec.one_buffer != nullptr ? spec.ranges_given : report.runs;
    }
    MemoryInfo memory =
        spec.gathered ? classify_gathered(*file, spec) : classify_memory(spec.buffer);
    // A stream-ordered request on GPU memory moves its bytes between the file and pinned staging
    // of its own, on ferry's POSIX path; its stream copies (cuda/stream_order.h).
    const bool staged = spec.stream_ordered && is_gpu(memory.kind);
    if (staged && settings.require != Require::kAny) {
      throw RouteError(fmt::format(
          "{} {} offset={} len={}: {}={} refuses ferry's POSIX path, and a stream-ordered "
          "request on GPU memory takes it (pinned staging, copied on the stream; "
          "cuFileReadAsync is not used); call read/write, or let the route be chosen",
          op == Op::kRead ? "read_async" : "write_async", file->path(), spec.offset, spec.size,
          "require", to_string(settings.require)));
    }
    const MemoryInfo staging_memory{MemoryKind::kHostPinned, memory.device, {}};
    // Layer 1 decides on route_memory, which differs from memory only under a test hook.
    MemoryInfo route_memory = accelerated_path().route_view(staged ? staging_memory : memory);
    report.memory = memory.kind;
    report.device = memory.device;
    report.direct = file->direct_fd() >= 0;
    std::size_t effective = spec.size;
    if (op == Op::kRead && !spec.gathered) {
      std::uint64_t file_size = file->size();
      effective = spec.offset >= file_size
                      ? 0
                      : std::min<std::uint64_t>(spec.size, file_size - spec.offset);
    }
    if (!tasks) tasks.emplace(spec.offset, effective, settings.task_size);
    // A gathered read measures the span from its first byte to its last.
    std::uint64_t span = effective;
    if (op == Op::kRead && spec.gathered) {
      span = 0;
      for (const ReadRange& r : spec.ranges) {
        if (r.size > 0) span = std::max<std::uint64_t>(span, r.file_offset + r.size - spec.offset);
      }
    }
    AcceleratedProbe cufile_probe;
    Layer1Plan layer1 = plan_layer1(*file, op, settings, route_memory, spec.offset, span,
                                    effective, &cufile_probe);
    report.page_cache = layer1.residency;
    RouteDecision& route = layer1.route;
    report.reasons = route.reasons;
    if (route.refusal) throw RouteError(*route.refusal);
    if (layer1.direct_refused) report.reasons.push_back(*layer1.direct_refused);
    std::shared_ptr<Backend> cufile_backend;
    Backend* backend = &host_path();
    if (route.path == Path::kCufile) {
      cufile_backend = std::move(cufile_probe.backend);
      backend = cufile_backend.get();
    }
    std::shared_ptr<cuda::StagedCopies> staged_copies;
    if (staged && tasks->count() > 0) {
      std::vector<cuda::StagedCopies::Piece> pieces(tasks->count());
      for (std::size_t i = 0; i < pieces.size(); ++i) {
        const Task t = (*tasks)[i];
        pieces[i] = {t.buffer_offset, t.size};
      }
      staged_copies = std::make_shared<cuda::StagedCopies>(
          static_cast<cuda::abi::Stream>(spec.stream), memory.device,
          op == Op::kRead ? cuda::StagedCopies::Direction::kToDevice
                          : cuda::StagedCopies::Direction::kFromDevice,
          reinterpret_cast<cuda::abi::DevicePtr>(spec.buffer), tasks->bytes(), std::move(pieces));
    }
    auto job = std::make_shared<Job>(
        file, state, backend, op,
        staged_copies ? staged_copies->staging() : static_cast<char*>(spec.buffer),
        staged_copies ? staging_memory : memory, settings, std::move(*tasks));
    job->start = start;
    job->staged = staged_copies;
    if (staged_copies && op == Op::kRead) job->parts_left = 2;
    if (spec.stream_ordered && !staged && job->tasks.count() > 0) {
      job->order =
          std::make_unique<cuda::StreamOrder>(static_cast<cuda::abi::Stream>(spec.stream), -1);
    }
    job->owned_backend = std::move(cufile_backend);
    job->compat_refused = cufile_probe.compat_refused;
    job->context.residency = report.page_cache;
    report.tasks = job->tasks.count();
    const std::size_t threads = workers_for(settings, is_gpu(route_memory.kind));
    const std::size_t jobs = std::min(
        {threads, std::max<std::size_t>(report.tasks, 1), backend->max_workers(job->context)});
    job->context.workers = jobs;
    job->claim = claim_for(job->tasks.count(), job->expected, jobs);
    report.workers = report.tasks == 0 ? 0 : jobs;
    std::string engine = backend->describe(job->context);
    if (job->order) {
      engine += fmt::format(
          "; stream-ordered on stream {}: started by the stream once the work queued on it "
          "before the call has run, on workers of its own; the work queued after waits for a "
          "flag set once the last byte is in place",
          fmt::ptr(spec.stream));
    } else if (job->staged && op == Op::kRead) {
      engine += fmt::format(
          "; stream-ordered on stream {}: read into pinned staging of its own from the call "
          "on, on workers of its own; the stream copies each task to GPU {} once it is "
          "staged (a wait for a flag, then the copy, queued on the stream at the call), after "
          "the work queued before the call and before the work queued after",
          fmt::ptr(spec.stream), memory.device);
    } else if (job->staged) {
      engine += fmt::format(
          "; stream-ordered on stream {}: the stream copies the buffer from GPU {} into pinned "
          "staging of its own after the work queued before the call (the work queued after "
          "may then change the buffer), then starts the writes from the staging, on workers "
          "of its own",
          fmt::ptr(spec.stream), memory.device);
    }
    if (op == Op::kWrite && backend == &host_path() && !spec.gathered) {
      const std::string ahead = host_path().prepare_write(*file, spec.offset, effective);
      if (!ahead.empty()) engine += "; " + ahead;
    }
    report.reasons.push_back({ReasonCode::kEngine, std::move(engine)});
    if (route.path == Path::kCufile) {
      report.cufile_tasks = report.tasks;
    } else {
      report.posix_tasks = report.tasks;
      report.cufile.why_not = "no request went to cuFile";
    }
    job->report = report;
    // Last before the first task runs, so the window holds this request's cuFile calls only.
    if (route.path == Path::kCufile) {
      job->observation = accelerated_path().observe(op, route_memory.device);
    }
    const bool ordered = job->order || job->staged;
    ThreadPool& pool = ordered ? file->runtime().ordered_pool() : file->runtime().pool();
    job->thread_pool = &pool;
    if (job->tasks.count() > 0) pool.ensure_threads(jobs);
    // From here the job completes (and ends what it started) whatever happens.
    note_request_started(job->expected);
    if (job->tasks.count() == 0) {
      job->jobs_left = 1;
      job->complete();
      return future;
    }
    job->jobs_left = jobs;
    // Each job queued may grow the pool to the jobs running and queued, up to nthreads: other
    // callers' requests share it.
    auto run_jobs = [job, jobs, threads] {
      job->thread_pool->note_request_queued();
      for (std::size_t j = 0; j < jobs; ++j) {
        job->thread_pool->submit([job] { job->start_one(); }, threads);
      }
    };
    // One task on host memory, to be waited for at once more often than not: the wait runs it
    // unless a worker has started it (bench/NOTES.md §19). GPU memory keeps its workers, whose
    // threads hold the device's context and staging.
    if (!ordered && jobs == 1 && job->tasks.count() == 1 && backend == &host_path() &&
        !is_gpu(memory.kind)) {
      job->helpable = true;
      job->unstarted = 1;
      state->set_helper([weak = std::weak_ptr<Job>(job)] {
        if (auto j = weak.lock()) j->help();
      });
    }
    if (!ordered) {
      run_jobs();
      return future;
    }
    try {
      if (job->order) {
        // The stream starts the jobs once its earlier work has run (in a CUDA thread).
        job->order->begin(std::move(run_jobs));
      } else if (op == Op::kRead) {
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
  } catch (...) {
    return fail_now(std::current_exception());
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

namespace {

constexpr const char* kSmallNotMeasured =
    "not measured: a read under 1 MiB is read buffered whatever its residency";

// The cheap facts of a small request: cuFile's outlook without its driver; never the residency
// or the probe.
struct CheapFacts final : Layer1Asks {
  explicit CheapFacts(OpenFile& f) : file(f) {}
  std::optional<std::optional<std::string>> compat_only() override {
    return accelerated_path().compat_only(file.fd());
  }
  std::optional<bool> resident() override { return std::nullopt; }
  std::optional<std::optional<std::string>> probe() override { return std::nullopt; }
  OpenFile& file;
};

// Layer 1 for a small request where the cheap facts decide it (the rules of walk_layer1, as
// every request); nullopt where a rule needs more (residency, cuFile's driver): submit() takes
// the request then.
std::optional<ReasonCode> small_layer1(const Settings& s, const cuda::QuickMemory& memory,
                                       std::size_t size, OpenFile& file, std::string* compat_why) {
  CheapFacts asks(file);
  Layer1Walk w = walk_layer1(s, is_gpu(memory.kind), size, asks);
  if (!w.decided) return std::nullopt;
  switch (w.rule) {
    case Layer1Rule::kCompatModeOn:
      return ReasonCode::kCompatModeOn;
    case Layer1Rule::kHostMemory:
      return memory.noted() ? ReasonCode::kNoCudaDriver : ReasonCode::kHostBuffer;
    case Layer1Rule::kBelowThreshold:
      return ReasonCode::kBelowThreshold;
    case Layer1Rule::kCompatOnly:
      *compat_why = std::move(w.why);
      return ReasonCode::kCufileCompatOnly;
    default:
      return std::nullopt;  // the residency and probe rules are never reached here
  }
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
  if (accelerated_path().host_treated_as_gpu()) return {};
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
  note_request_started(size);
  try {
    if (op == Op::kRead && size >= host_path().cold_task_min()) {
      // Large enough for the cold rule: measure, as submit() does.
      const std::uint64_t file_size = file.size();
      const std::size_t effective =
          offset >= file_size ? 0 : std::min<std::uint64_t>(size, file_size - offset);
      route.page_cache = host_path().residency(file.fd(), offset, effective);
      context.residency = route.page_cache;
    }
    bytes = host_path().run_inline(context, Task{offset, 0, size});
  } catch (...) {
    route.cold_direct = direct_tasks.load() > 0;
    route.cold_refused = cold_refused.load();
    route.nanoseconds = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    RouteReport report =
        small_report(file.path(), route, route.cold_refused ? file.cold_direct_refused() : "");
    record_request(report, true);
    note_request_ended(size);
    file.set_last_route(report);
    throw;
  }
  route.bytes = bytes;
  route.cold_direct = direct_tasks.load(std::memory_order_relaxed) > 0;
  route.cold_refused = cold_refused.load(std::memory_order_relaxed);
  route.nanoseconds = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
  // The same bucket record_request() picks: host memory, a GPU's, or a GPU not known.
  const int device = !is_gpu(memory.kind) ? -1
                     : memory.device >= 0 ? memory.device
                                          : kDeviceNotRecorded;
  record_small_request(op, bytes, route.nanoseconds, route.layer1, route.cold_direct, device);
  note_request_ended(size);
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
    // Asynchronous small requests are at most 64 KiB: never cold (cold_task_min is 1 MiB), so
    // their report needs no word from the File beyond its path.
    state->complete_unshared(bytes, file->path(), route);
  } catch (...) {
    file->end_request();
    state->complete(
        0, std::current_exception(),
        small_report(file->path(), route, route.cold_refused ? file->cold_direct_refused() : ""));
  }
  return IoFuture(state);
}

RouteReport small_report(const std::string& path, const SmallRoute& r,
                         const std::string& cold_refused) {
  RouteReport report;
  report.op = r.op;
  report.file = path;
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
  // Small requests never run on a File's O_DIRECT descriptor (small_settings()).
  report.reasons.push_back(
      {ReasonCode::kEngine, host_path().describe_inline(r.op, memory, settings)});
  if (r.cold_direct) report.reasons.push_back(cold_direct_reason(report));
  if (r.cold_refused) report.reasons.push_back({ReasonCode::kDirectIoRefused, cold_refused});
  report.cufile.why_not = "no request went to cuFile";
  return report;
}

}  // namespace ferry::core
