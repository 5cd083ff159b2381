// Runs one request: decides its route, splits it into tasks, runs workers on the thread pool
// and completes an IoFuture with the byte count, the error and the route report.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

#include "core/open_file.h"
#include "ferry/file.h"
#include "ferry/route.h"

namespace ferry::core {

class RequestState {
 public:
  void complete(std::size_t bytes, std::exception_ptr error, RouteReport report);
  bool ready() const;
  void wait() const;
  bool wait_for(double seconds) const;
  void add_progress(std::uint64_t bytes) { progress_.fetch_add(bytes, std::memory_order_relaxed); }
  std::uint64_t progress() const { return progress_.load(std::memory_order_relaxed); }
  std::size_t get() const;  // waits; rethrows the error
  RouteReport route() const;

 private:
  std::atomic<std::uint64_t> progress_{0};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::size_t bytes_ = 0;
  std::exception_ptr error_;
  RouteReport report_;
};

// Starts the request. Errors found before any I/O (bad range, strict mode) complete the future
// with that error at once.
IoFuture submit(std::shared_ptr<OpenFile> file, Op op, void* buffer, std::size_t size,
                std::uint64_t offset);

}  // namespace ferry::core
