// A fixed set of worker threads running submitted jobs in FIFO order. The pool only grows
// (ensure_threads), so requests made under a larger nthreads setting get their parallelism.
// All methods are thread-safe; the destructor finishes queued jobs and joins the workers.
// Jobs must not block on other jobs of the same pool.
#pragma once

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

  // The process-wide pool used by File requests.
  static ThreadPool& shared();

 private:
  void work();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

}  // namespace ferry::core
