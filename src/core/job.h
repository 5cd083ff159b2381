// One request on the pool: its tasks, the jobs that take them (each with a worker of the
// request's backend), the first failure, and the completion that builds the report and completes
// the future (docs/internals.md, "A read, step by step (the long form)", steps 3 to 5). Made by
// core::submit (request.cc) from a request's plan.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "core/backend.h"
#include "core/open_file.h"
#include "core/paths.h"
#include "core/request.h"
#include "core/task_splitter.h"
#include "core/thread_pool.h"
#include "cuda/stream_order.h"
#include "ferry/route.h"
#include "ferry/settings.h"

namespace ferry::core {

// The reason a request gives for its tasks that read cold data with O_DIRECT.
RouteReason cold_direct_reason(const RouteReport& report);

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
  PageCacheResidency residency;  // the request's, before it ran: context.residency points here
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
  // A remote object only: the window on its GETs (the report's source layer).
  std::unique_ptr<io::SourceWindow> source;
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
  std::size_t threads = 1;  // the most threads its pool may grow to for it (request.cc says why)

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
  void fail(std::exception_ptr e, std::size_t task, std::uint64_t moved);

  // The bytes known to be in place from the request's start: whole tasks up to the first that is
  // short or did not run, plus what the failing task moved when it is that one. A resumable
  // prefix, unlike the sum (tasks after a gap may have completed too).
  std::uint64_t prefix_done() const;

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
  void run_one();

  // Runs once, after every job is done.
  void complete();

  // A staged read's copies have run on its stream.
  void copies_done() { finish_part(); }

 private:
  void finish_part();
};

// Small tasks are taken in runs of consecutive ones when there are many more than workers:
// enough runs per worker (16) for the last ones to balance, at most 256 tasks each.
std::size_t claim_for(std::size_t tasks, std::uint64_t bytes, std::size_t workers);

}  // namespace ferry::core
