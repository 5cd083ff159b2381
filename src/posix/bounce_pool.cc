#include "posix/bounce_pool.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

#include "cuda/cuda_driver.h"

namespace ferry::posix {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;

// Pinned memory for all of a stager's slots in one region. Measured on the GPU machine
// (bench/NOTES.md §10): cuMemHostAlloc costs 0.7 ms per MiB and does not get faster from several
// threads (64 MiB: 40 ms from one thread, 40 ms from eight), while anonymous memory on
// transparent huge pages, registered with cuMemHostRegister, cost 17 ms for 64 MiB, and its page
// faults run in parallel in each worker's thread. Returns null when registration fails (the
// caller then falls back to cuMemHostAlloc).
char* map_and_register(std::size_t bytes, void** mapping, std::size_t* mapped) {
  *mapped = bytes + kHugePage;  // room to align the region to a huge page
  void* p = mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto aligned = (reinterpret_cast<std::uintptr_t>(p) + kHugePage - 1) / kHugePage * kHugePage;
  char* region = reinterpret_cast<char*>(aligned);
  madvise(region, bytes, MADV_HUGEPAGE);  // advice only: 4 KiB pages work too, more slowly
  // Write every page, with a non-zero byte, before registering:
  // - untouched private pages would be pinned as the shared zero page, which the first write
  //   replaces by copy-on-write (seen on the GPU machine: wrong bytes in the Gpu.* tests);
  // - Linux 6.12+ splits "underused" huge pages under memory pressure and maps their all-zero
  //   4 KiB pages to the shared zero page again. A zero-filled staging region is exactly that,
  //   and small requests leave most of it zero: the GPU stress test lost bytes this way when run
  //   beside the 8 GiB tests (bench/NOTES.md §10). Data of 2 MiB of zeros can still make a huge
  //   page all zero, which is why this staging is opt-in.
  std::memset(region, 0xA5, bytes);
  if (cuda::driver().MemHostRegister(region, bytes, CU_MEMHOSTREGISTER_PORTABLE) != CUDA_SUCCESS) {
    munmap(p, *mapped);
    return nullptr;
  }
  *mapping = p;
  return region;
}

// Staging memory comes from cuMemHostAlloc unless FERRY_STAGING=register asks for registered
// huge pages (map_and_register), which made the first request 2 to 4x cheaper on the GPU machine
// but lost bytes under memory pressure (see above; bench/NOTES.md §10). Opt-in until proven.
bool register_staging() {
  static const bool on = [] {
    const char* v = std::getenv("FERRY_STAGING");
    return v != nullptr && std::string_view(v) == "register";
  }();
  return on;
}

std::unique_ptr<Stager> create(int device, std::size_t size) {
  auto s = std::make_unique<Stager>();
  s->device = device;
  s->size = size;
  s->slots.assign(kPipelineDepth, nullptr);
  s->events.assign(kPipelineDepth, nullptr);
  s->pending.assign(kPipelineDepth, false);
  void* mapping = nullptr;
  std::size_t mapped = 0;
  char* region = nullptr;
  // The cleanup below runs if any allocation throws half-way.
  auto cleanup = [&] {
    if (region != nullptr) {
      cuda::driver().MemHostUnregister(region);
      munmap(mapping, mapped);
      return;
    }
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
    if (device >= 0 && size <= SIZE_MAX / (2 * kPipelineDepth) && register_staging())
      region = map_and_register(size * kPipelineDepth, &mapping, &mapped);
    if (region != nullptr) {
      // Kept for the life of the process, like every stager: no cleanup needed.
      for (std::size_t i = 0; i < kPipelineDepth; ++i) s->slots[i] = region + i * size;
    }
    for (char*& slot : s->slots) {
      if (slot != nullptr) continue;
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
      cuda::check(d.StreamCreate(&s->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
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

BouncePool& BouncePool::shared() {
  // Leaked on purpose: pinned memory is returned to the driver at process exit, and a static
  // destructor must not race with workers still releasing stagers.
  static BouncePool* pool = new BouncePool;
  return *pool;
}

}  // namespace ferry::posix
