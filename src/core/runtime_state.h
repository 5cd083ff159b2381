// What requests run on: the worker threads and the staging memory, owned by one runtime, and the
// environment (core/paths.h) its requests ask for the system's calls and the paths. The
// process has a default one (backends/default_runtime.h: never destroyed, restarted in a fork()
// child); ferry::Runtime makes others. Files attach to a runtime while open, and a runtime is
// destroyed only once none is. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>

#include "core/paths.h"
#include "core/thread_pool.h"
#include "io/staging_pool.h"

namespace ferry::core {

class RuntimeState {
 public:
  explicit RuntimeState(Environment env);
  // Waits until no File is attached, then joins the workers and frees the staging memory.
  ~RuntimeState();
  RuntimeState(const RuntimeState&) = delete;
  RuntimeState& operator=(const RuntimeState&) = delete;

  ThreadPool& pool() { return *pool_.load(std::memory_order_acquire); }
  // The workers of stream-ordered requests (File::read_async), apart from pool(): a request of
  // pool() may wait for the GPU, which may wait for a stream-ordered request (one on the legacy
  // default stream, ahead of pool()'s copies); with its own threads, that one always runs.
  ThreadPool& ordered_pool() { return *ordered_pool_.load(std::memory_order_acquire); }
  io::StagingPool& staging() { return *staging_.load(std::memory_order_acquire); }
  const Environment& env() const { return env_; }

  // A File attaches when it opens and detaches once closed (its requests done).
  void attach();
  void detach();
  std::size_t attached() const;

  // In a fork() child: the workers and staging copied from the parent are unusable (threads
  // that do not exist, pinned memory of a CUDA context that does not survive fork) and are left
  // alone; the runtime starts new ones.
  void restart_in_child();

 private:
  const Environment env_;
  std::atomic<ThreadPool*> pool_;
  std::atomic<ThreadPool*> ordered_pool_;
  std::atomic<io::StagingPool*> staging_;
  mutable std::mutex mu_;
  std::condition_variable idle_;
  std::size_t files_ = 0;
};

}  // namespace ferry::core
