#include "io/staging_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "cuda/cuda_driver.h"
#include "io/numa_staging.h"

namespace ferry::io {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

// Pinned memory for all of a stager's slots in one region: anonymous memory on transparent huge
// pages, written, then registered with cuMemHostRegister. Measured on the GPU machine
// (bench/NOTES.md §10): cuMemHostAlloc costs 0.35 to 0.7 ms per MiB and is no faster from several
// threads (64 MiB: 40 ms), where this costs 11 to 17 ms for 64 MiB, most of it page faults that
// run in each worker's own thread. Returns null when registration fails (the caller then uses
// cuMemHostAlloc). Kept for the life of the process, like every stager.
// `node` >= 0: the pages are placed on that NUMA node (the GPU's, io/numa_staging.h) as they
// are first written below.
char* map_and_register(std::size_t bytes, int node, void** mapping, std::size_t* mapped_bytes) {
  const std::size_t mapped = bytes + kHugePage;  // room to align the region to a huge page
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto aligned = (reinterpret_cast<std::uintptr_t>(p) + kHugePage - 1) / kHugePage * kHugePage;
  char* region = reinterpret_cast<char*>(aligned);
  madvise(region, bytes, MADV_HUGEPAGE);  // advice only: 4 KiB pages work too, more slowly
  if (node >= 0) prefer_node(region, bytes, node);  // a preference: elsewhere still works
  // Not inherited by fork(): a child must never share (and copy-on-write) pages the GPU has
  // pinned; its runtime starts new staging there (RuntimeState::restart_in_child).
  madvise(p, mapped, MADV_DONTFORK);
  // Every page written before it is pinned: an untouched private page would be pinned as the
  // shared zero page and replaced by copy-on-write at the first write. Non-zero, so that no page
  // is ever an all-zero candidate for the kernel's split of underused huge pages.
  std::memset(region, 0xA5, bytes);
  if (cuda::driver().MemHostRegister(region, bytes, cuda::abi::kMemHostRegisterPortable) !=
      cuda::abi::kSuccess) {
    munmap(p, mapped);
    return nullptr;
  }
  *mapping = p;
  *mapped_bytes = mapped;
  return region;
}

// Frees what create() made: the stream and events, then the memory.
void destroy(Stager& s) {
  if (s.device >= 0) {
    const cuda::Driver* d = cuda::driver_or_null();
    if (d == nullptr) return;  // CUDA is gone (a fork() child): nothing can be freed
    cuda::use_device(s.device);
    if (s.stream != nullptr) d->StreamDestroy(s.stream);
    for (cuda::abi::Event e : s.events) {
      if (e != nullptr) d->EventDestroy(e);
    }
    if (s.registered != nullptr) {
      d->MemHostUnregister(s.registered);
      munmap(s.mapping, s.mapped);
      return;
    }
    for (char* p : s.slots) {
      if (p != nullptr) d->MemFreeHost(p);
    }
    return;
  }
  for (char* p : s.slots) std::free(p);
}

std::unique_ptr<Stager> create(int device, std::size_t size) {
  auto s = std::make_unique<Stager>();
  s->device = device;
  s->size = size;
  s->slots.assign(kPipelineDepth, nullptr);
  s->events.assign(kPipelineDepth, nullptr);
  s->pending.assign(kPipelineDepth, false);
  if (device >= 0 && size <= SIZE_MAX / (2 * kPipelineDepth)) {
    const int node = staging_node(device).node;
    s->registered = map_and_register(size * kPipelineDepth, node, &s->mapping, &s->mapped);
    if (s->registered != nullptr) {
      for (std::size_t i = 0; i < kPipelineDepth; ++i) s->slots[i] = s->registered + i * size;
    }
  }
  // The cleanup below runs if any allocation throws half-way.
  auto cleanup = [&] { destroy(*s); };
  try {
    for (char*& slot : s->slots) {
      if (slot != nullptr) continue;  // in the registered region
      if (device < 0) {
        slot = static_cast<char*>(std::aligned_alloc(kAlignment, size));
        if (slot == nullptr) throw std::bad_alloc();
      } else {
        void* p = nullptr;
        cuda::check(cuda::driver().MemHostAlloc(&p, size, cuda::abi::kMemHostAllocPortable),
                    "cuMemHostAlloc (staging buffer)");
        slot = static_cast<char*>(p);
      }
    }
    if (device >= 0) {
      const cuda::Driver& d = cuda::driver();
      // A blocking stream: its copies wait for work queued before them on the legacy default
      // stream, where CuPy and PyTorch queue by default (a cuMemsetD8 or a zeros() kernel that
      // would otherwise land on top of the bytes read), and legacy-stream work queued after
      // waits for them. Streams of this kind do not wait for each other.
      cuda::check(d.StreamCreate(&s->stream, cuda::abi::kStreamDefault), "cuStreamCreate");
      for (cuda::abi::Event& e : s->events) {
        cuda::check(d.EventCreate(&e, cuda::abi::kEventDisableTiming), "cuEventCreate");
      }
    }
  } catch (...) {
    cleanup();
    throw;
  }
  return s;
}

}  // namespace

StagingPool::Handle StagingPool::acquire(int device, std::size_t size) {
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

void StagingPool::release(Stager* stager) {
  std::lock_guard lock(mu_);
  free_.emplace_back(stager);
}

std::size_t StagingPool::idle() const {
  std::lock_guard lock(mu_);
  return free_.size();
}

std::size_t StagingPool::free_idle() {
  std::vector<std::unique_ptr<Stager>> idle;
  {
    std::lock_guard lock(mu_);
    idle.swap(free_);
  }
  // destroy() makes each GPU stager's context current: the caller's is put back after.
  const bool any_gpu =
      std::any_of(idle.begin(), idle.end(), [](const auto& s) { return s->device >= 0; });
  const cuda::Driver* d = any_gpu ? cuda::driver_or_null() : nullptr;
  cuda::abi::Context saved = nullptr;
  if (d != nullptr && d->CtxGetCurrent(&saved) != cuda::abi::kSuccess) saved = nullptr;
  std::size_t bytes = 0;
  for (auto& s : idle) {
    bytes += s->size * s->slots.size();
    destroy(*s);
  }
  if (d != nullptr) d->CtxSetCurrent(saved);
  return bytes;
}

StagingPool::~StagingPool() {
  for (auto& s : free_) destroy(*s);
}

}  // namespace ferry::io
