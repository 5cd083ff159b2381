// A fixed set of worker threads running submitted jobs in FIFO order. The pool only grows
// (ensure_threads), so requests made under a larger nthreads setting get their parallelism.
// All methods are thread-safe; the destructor finishes queued jobs and joins the workers.
// Jobs must not block on other jobs of the same pool. A long job should check waiting() between
// steps and, when others wait, submit its rest and return (the engine does, between tasks).
#pragma once

#include <atomic>
#include <condition_variable>
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
  void submit(std::function<void()> job);
  // Jobs queued and not yet started (no lock: a hint that may be a moment old).
  std::size_t waiting() const { return queued_.load(std::memory_order_relaxed); }

 private:
  void work();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
  std::atomic<std::size_t> queued_{0};
};

}  // namespace ferry::core
