#include "posix/bounce_pool.h"

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>

#include "cuda/cuda_driver.h"

namespace ferry::posix {
namespace {

std::unique_ptr<Stager> create(int device, std::size_t size) {
  auto s = std::make_unique<Stager>();
  s->device = device;
  s->size = size;
  s->slots.assign(kPipelineDepth, nullptr);
  s->events.assign(kPipelineDepth, nullptr);
  s->pending.assign(kPipelineDepth, false);
  // The cleanup below runs if any allocation throws half-way.
  auto cleanup = [&] {
    for (char* p : s->slots) {
      if (p == nullptr) continue;
      if (device < 0) {
        std::free(p);
      } else {
        cuda::driver().MemFreeHost(p);
      }
    }
  };
  try {
    for (char*& slot : s->slots) {
      if (device < 0) {
        slot = static_cast<char*>(std::aligned_alloc(kAlignment, size));
        if (slot == nullptr) throw std::bad_alloc();
      } else {
        void* p = nullptr;
        cuda::check(cuda::driver().MemHostAlloc(&p, size, CU_MEMHOSTALLOC_PORTABLE),
                    "cuMemHostAlloc (bounce buffer)");
        slot = static_cast<char*>(p);
      }
    }
    if (device >= 0) {
      const cuda::Driver& d = cuda::driver();
      // A blocking stream: its copies wait for work queued before them on the legacy default
      // stream, where CuPy and PyTorch queue by default (a cuMemsetD8 or a zeros() kernel that
      // would otherwise land on top of the bytes read), and legacy-stream work queued after
      // waits for them. Streams of this kind do not wait for each other.
      cuda::check(d.StreamCreate(&s->stream, CU_STREAM_DEFAULT), "cuStreamCreate");
      for (CUevent& e : s->events) {
        cuda::check(d.EventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
      }
    }
  } catch (...) {
    cleanup();
    throw;
  }
  return s;
}

}  // namespace

BouncePool::Handle BouncePool::acquire(int device, std::size_t size) {
  {
    std::lock_guard lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if ((*it)->device == device && (*it)->size == size) {
        Stager* s = it->release();
        free_.erase(it);
        return Handle(s, Release{this});
      }
    }
  }
  return Handle(create(device, size).release(), Release{this});
}

void BouncePool::release(Stager* stager) {
  std::lock_guard lock(mu_);
  free_.emplace_back(stager);
}

namespace {
std::atomic<BouncePool*> current{nullptr};
std::once_flag made;
}  // namespace

BouncePool& BouncePool::shared() {
  // Leaked on purpose: pinned memory is returned to the driver at process exit, and a static
  // destructor must not race with workers still releasing stagers.
  std::call_once(made, [] {
    current.store(new BouncePool);
    // A child made by fork() cannot use its parent's pinned memory or streams (CUDA does not
    // survive fork), and a thread of the parent may hold the lock: it starts an empty pool.
    pthread_atfork(nullptr, nullptr, [] { current.store(new BouncePool); });
  });
  return *current.load(std::memory_order_acquire);
}

}  // namespace ferry::posix
