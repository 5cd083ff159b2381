#include "core/thread_pool.h"

#include <algorithm>
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

bool ThreadPool::idle() const {
  std::lock_guard lock(mu_);
  return running_ == 0 && jobs_.empty();
}

void ThreadPool::submit(std::function<void()> job, std::size_t grow_to) {
  {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(job));
    queued_.store(jobs_.size(), std::memory_order_relaxed);
    const std::size_t want = std::min(grow_to, running_ + jobs_.size());
    while (threads_.size() < want) threads_.emplace_back([this] { work(); });
  }
  submitted_.fetch_add(1, std::memory_order_relaxed);
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
      ++running_;
    }
    job();
    job = nullptr;  // what it holds goes before the job counts as returned
    std::lock_guard lock(mu_);
    --running_;
  }
}

}  // namespace ferry::core
