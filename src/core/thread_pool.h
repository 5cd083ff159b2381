// A set of worker threads running submitted jobs in FIFO order. The pool only grows: to a
// request's own parallelism (ensure_threads), and, as a job is queued, to the jobs running and
// queued, up to the submitter's nthreads setting (submit's grow_to), so that concurrent one-task
// requests from several callers run side by side instead of queueing for the thread the first
// of them started. (The count and the queueing are one step: callers that counted before any of
// them had queued all saw an empty pool.)
// All methods are thread-safe; the destructor finishes queued jobs and joins the workers.
// Jobs must not block on other jobs of the same pool. A long job should check waiting() between
// steps and, when others wait, submit its rest and return (the engine does, between tasks).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry::core {

class ThreadPool {
 public:
  explicit ThreadPool(std::size_t nthreads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void ensure_threads(std::size_t nthreads);
  std::size_t size() const;
  // Queues `job`; then at least min(grow_to, jobs running + queued) threads.
  void submit(std::function<void()> job, std::size_t grow_to = 0);
  // Jobs queued and not yet started (no lock: a hint that may be a moment old).
  std::size_t waiting() const { return queued_.load(std::memory_order_relaxed); }
  // No job queued or running: every worker waits for work, what its last job held already gone.
  bool idle() const;
  // Jobs submitted since the pool was made (a request's jobs, and their continuations).
  std::uint64_t submitted() const { return submitted_.load(std::memory_order_relaxed); }

  // Requests whose jobs are queued and none of which has started: the ones a running request
  // yields its threads to. Queued before a request's first job is submitted, started when the
  // first of its jobs runs (each exactly once).
  void note_request_queued() { unstarted_.fetch_add(1, std::memory_order_relaxed); }
  void note_request_started() { unstarted_.fetch_sub(1, std::memory_order_relaxed); }
  bool requests_waiting_to_start() const { return unstarted_.load(std::memory_order_relaxed) > 0; }

 private:
  void work();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
  std::size_t running_ = 0;  // jobs taken by a thread and not yet returned
  std::atomic<std::size_t> queued_{0};
  std::atomic<std::uint64_t> submitted_{0};
  std::atomic<long> unstarted_{0};
};

}  // namespace ferry::core
