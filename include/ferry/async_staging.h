// Asynchronous staging of a checkpoint's tensors into pinned host memory (ferry.dcp.Stager, for
// dcp.async_save): a pool of pinned buffers kept across saves, sized by the first and grown only
// when a later save needs more, and a stage operation that queues every GPU tensor's copy on
// ferry's own stream per device, returns at once and completes in the pool's worker. A pool is
// thread-safe; one staging at a time holds it (docs/training.md "Asynchronous saves").
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ferry {

// One tensor to stage: `nbytes` contiguous bytes at `data`, in GPU (device or managed) or host
// memory; `name` names it in errors.
struct StageItem {
  std::string name;
  const void* data = nullptr;
  std::uint64_t nbytes = 0;
};

// Work already queued on `stream` (a CUstream handle; 0: the legacy default stream) of GPU
// `device` that the copies from that GPU must follow: the caller's current stream, whose kernels
// are still writing the tensors.
struct StageAfter {
  int device = 0;
  std::uintptr_t stream = 0;
};

// What a pool holds and has done, for reports and for the tests' flat-memory checks.
struct AsyncStagingReport {
  bool pinned = true;                // false: no CUDA driver or GPU, the pool is pageable memory
  std::uint64_t pinned_bytes = 0;    // the pool's memory held now
  std::uint64_t chunks = 0;          // pinned buffers held now
  std::uint64_t allocations = 0;     // cuMemHostAlloc calls over the pool's life
  std::uint64_t growths = 0;         // stages that had to allocate (the first included)
  std::uint64_t stages = 0;          // stages begun
  std::uint64_t last_bytes = 0;      // the last stage's tensor bytes
  std::uint64_t last_gpu_bytes = 0;  // of which copied from GPU memory
  std::uint64_t last_batches = 0;    // its copy batches (an event each)
  double last_queue_seconds = 0;     // stage() of the last stage, call to return
  double last_staged_seconds = 0;    // call to the last byte in place
};

class AsyncStagingPool;
struct AsyncStagingState;  // the pool's memory, streams and worker; async_staging.cc

// One stage's copies: item i's bytes land at place(i), valid while this object lives. The
// object holds the pool (a next stage waits for it to go); its destructor waits for the copies.
class AsyncStaging {
 public:
  ~AsyncStaging();
  AsyncStaging(const AsyncStaging&) = delete;
  AsyncStaging& operator=(const AsyncStaging&) = delete;

  // Where item i is staged (4096-aligned, pinned).
  void* place(std::size_t i) const { return places_[i]; }
  std::size_t size() const { return places_.size(); }
  // Blocks until every copy has landed; throws CudaError naming the first tensor whose copy
  // failed. Idempotent.
  void wait() const;
  bool done() const;

 private:
  friend class AsyncStagingPool;
  friend struct AsyncStagingState;
  struct Shared;
  explicit AsyncStaging(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
  std::shared_ptr<AsyncStagingState> pool_;  // set once the stage holds the pool
  std::vector<void*> places_;
};

class AsyncStagingPool {
 public:
  AsyncStagingPool();
  ~AsyncStagingPool();  // close()
  AsyncStagingPool(const AsyncStagingPool&) = delete;
  AsyncStagingPool& operator=(const AsyncStagingPool&) = delete;

  // Lays `items` out in the pool (growing it only when they do not fit what it holds), queues
  // the GPU items' copies on ferry's stream of their device (after the work on `after`'s
  // streams; a device not listed: after its legacy default stream), hands the host items to the
  // pool's worker (memcpy) and returns. The caller's memory must stay unchanged until the
  // AsyncStaging is done. Waits up to `wait_for_previous` for the previous AsyncStaging to be
  // released, else throws Error saying so. A copy that cannot be queued throws CudaError naming the
  // tensor, after the copies already queued have run.
  std::shared_ptr<AsyncStaging> stage(
      std::span<const StageItem> items, std::span<const StageAfter> after = {},
      std::chrono::milliseconds wait_for_previous = std::chrono::milliseconds(0));

  // Waits for the current staging's copies and frees the pinned memory; a later stage() starts
  // afresh. Throws Error while a AsyncStaging is still held.
  void close();

  AsyncStagingReport report() const;

 private:
  std::shared_ptr<AsyncStagingState> state_;
};

}  // namespace ferry
