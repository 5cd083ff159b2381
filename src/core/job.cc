#include "core/job.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/routing.h"
#include "core/runtime_state.h"
#include "ferry/error.h"

namespace ferry::core {

RouteReason cold_direct_reason(const RouteReport& report) {
  // Measured on the GPU machine's disk (bench/NOTES.md §9): O_DIRECT read cold data 1.27x faster
  // than buffered reads, at 1/26 of the CPU time.
  return {ReasonCode::kColdDirect,
          fmt::format("{} of {} task(s) were not in the page cache and were read with O_DIRECT, "
                      "faster and cheaper than buffered reads of cold data",
                      report.direct_tasks, report.tasks)};
}

void Job::fail(std::exception_ptr e, std::size_t task, std::uint64_t moved) {
  std::lock_guard lock(error_mu);
  if (!error) {
    error = std::move(e);
    failed_task = task;
    partial = moved;
  }
  cancelled.store(true, std::memory_order_relaxed);
}

std::uint64_t Job::prefix_done() const {
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

void Job::run_one() {
  ThreadPool& pool = *thread_pool;
  if (!begun.exchange(true, std::memory_order_relaxed)) pool.note_request_started();
  // Turns share threads in real time: the machine's clock, whatever the runtime's.
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

void Job::complete() {
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
  const Environment& env = file->runtime().env();
  report.seconds = std::chrono::duration<double>(env.now() - start).count();
  if (source) {
    source->end(report.source);
    source.reset();
  }
  if (observation) {
    observation->end(report.cufile);
    observation.reset();
    auto refusal = refuse_layer2(context.settings, report, compat_refused, &report.cufile.unjudged);
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
  env.record_request(report, e != nullptr);
  env.note_request_ended(expected);
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

void Job::finish_part() {
  if (parts_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    state->complete(result_bytes, result_error, report);
  }
}

std::size_t claim_for(std::size_t tasks, std::uint64_t bytes, std::size_t workers) {
  constexpr std::uint64_t kSmallTask = 64 << 10;
  if (tasks == 0 || bytes / tasks > kSmallTask) return 1;
  return std::clamp<std::size_t>(tasks / (std::max<std::size_t>(workers, 1) * 16), 1, 256);
}

}  // namespace ferry::core
