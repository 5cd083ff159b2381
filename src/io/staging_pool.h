// Reusable staging buffers for the POSIX path: for a GPU, `depth` pinned host buffers with one
// stream (ordered after the legacy default stream) and one event per buffer; for O_DIRECT into
// host memory, page-aligned host buffers. Allocating pinned memory costs milliseconds, so stagers
// are kept and reused by later requests. One pool per runtime (core::RuntimeState); it frees its
// stagers when destroyed, after every stager is back. Thread-safe; a Stager is used by one thread
// at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/cuda_abi.h"

namespace ferry::io {

constexpr std::size_t kAlignment = 4096;   // O_DIRECT offsets, lengths and buffers
constexpr std::size_t kPipelineDepth = 2;  // chunks in flight per worker: read k+1, copy k

struct Stager {
  int device = -1;  // -1: aligned host memory, no stream
  std::size_t size = 0;
  std::vector<char*> slots;
  cuda::abi::Stream stream = nullptr;
  std::vector<cuda::abi::Event> events;  // events[i] completes when slots[i] may be reused
  std::vector<bool> pending;             // an event was recorded on slots[i] and not yet waited for
  std::size_t next = 0;                  // the slot to use next
  // Where the slots' memory came from: one registered mapping, else one allocation per slot.
  void* mapping = nullptr;
  std::size_t mapped = 0;
  char* registered = nullptr;
};

class StagingPool {
 public:
  struct Release {
    StagingPool* pool;
    void operator()(Stager* s) const { pool->release(s); }
  };
  using Handle = std::unique_ptr<Stager, Release>;

  // A stager for `device` (current context must be the device's) with slots of `size` bytes.
  Handle acquire(int device, std::size_t size);
  // Stagers waiting for reuse.
  std::size_t idle() const;
  // Frees the stagers waiting for reuse (those in use stay); returns the bytes of their buffers.
  std::size_t free_idle();

  StagingPool() = default;
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

 private:
  void release(Stager* stager);
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Stager>> free_;
};

}  // namespace ferry::io
