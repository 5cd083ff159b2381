// warm_up: the pool's threads take one staging buffer each, in parallel, and give it back to the
// staging pool, where the first request's workers find it.
#include "ferry/warm_up.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>

#include "backends/default_runtime.h"
#include "core/thread_pool.h"
#include "cuda/cuda_driver.h"
#include "ferry/settings.h"
#include "io/staging_pool.h"

namespace ferry {

void warm_up(int device) {
  core::RuntimeState& runtime = backends::default_runtime();
  const Settings s = runtime.env().settings({});
  cuda::use_device(device);  // throws CudaError for no driver or a bad ordinal
  const std::size_t staging_bytes =
      (s.bounce_buffer_size + io::kAlignment - 1) / io::kAlignment * io::kAlignment;
  core::ThreadPool& pool = runtime.pool();
  pool.ensure_threads(std::max(s.nthreads, s.host_nthreads));
  std::mutex mu;
  std::condition_variable cv;
  std::size_t left = s.nthreads;
  std::exception_ptr error;
  // All stagers are held until every job has one, so each job makes its own.
  std::vector<io::StagingPool::Handle> held;
  for (std::size_t i = 0; i < s.nthreads; ++i) {
    pool.submit([&] {
      std::exception_ptr e;
      io::StagingPool::Handle h{nullptr, io::StagingPool::Release{nullptr}};
      try {
        cuda::use_device(device);
        h = runtime.staging().acquire(device, staging_bytes);
      } catch (...) {
        e = std::current_exception();
      }
      std::lock_guard lock(mu);
      if (e && !error) error = e;
      if (h) held.push_back(std::move(h));
      if (--left == 0) cv.notify_all();
    });
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return left == 0; });
  held.clear();  // back to the pool
  if (error) std::rethrow_exception(error);
}

}  // namespace ferry
