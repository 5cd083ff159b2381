#include "core/thread_pool.h"

#include <pthread.h>

#include <atomic>

namespace ferry::core {

ThreadPool::ThreadPool(std::size_t nthreads) { ensure_threads(nthreads); }

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::ensure_threads(std::size_t nthreads) {
  std::lock_guard lock(mu_);
  while (threads_.size() < nthreads) threads_.emplace_back([this] { work(); });
}

std::size_t ThreadPool::size() const {
  std::lock_guard lock(mu_);
  return threads_.size();
}

void ThreadPool::submit(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
    queued_.store(jobs_.size(), std::memory_order_relaxed);
  }
  cv_.notify_one();
}

void ThreadPool::work() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping_ and drained.
      job = std::move(jobs_.front());
      jobs_.pop_front();
      queued_.store(jobs_.size(), std::memory_order_relaxed);
    }
    job();
  }
}

namespace {
std::atomic<ThreadPool*> current{nullptr};
std::once_flag made;
}  // namespace

ThreadPool& ThreadPool::shared() {
  // Leaked on purpose: requests still in flight at exit keep running threads that must not be
  // joined by a static destructor racing with them.
  std::call_once(made, [] {
    current.store(new ThreadPool(0));
    // fork() copies only the calling thread: the child's copy of the pool has threads that do
    // not exist and perhaps a lock held by one of them. The child starts a new pool (its threads
    // start with its first request) and leaves the copy untouched.
    pthread_atfork(nullptr, nullptr, [] { current.store(new ThreadPool(0)); });
  });
  return *current.load(std::memory_order_acquire);
}

}  // namespace ferry::core
