// TEST DOUBLE of the part of libcuda's driver API that ferry uses, for the tests only: never
// installed, never loaded unless FERRY_CUDA_LIBRARY names it. It lets the GPU tests run on a
// machine without a GPU (CI), and it models, on purpose, the hazards that real CUDA documents
// but a test on one GPU meets only by chance:
//   - Streams share a few hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, default 8; streams are
//     given queues round-robin as they are created, the legacy default stream queue 0). Each
//     queue runs its work in the order it was queued, whatever the stream, so a stream waiting
//     in cuStreamWaitValue32 holds back every stream behind it on its queue: the deadlock that
//     cuStreamWaitValue32's documentation warns of ("synchronization ordering established
//     through this API is not visible to CUDA").
//   - Host functions (cuLaunchHostFunc) run one at a time on one thread, hold their queue until
//     they return, and every driver call made from one fails with CUDA_ERROR_NOT_PERMITTED.
//   - The legacy default stream waits for the blocking streams' earlier work and they wait for
//     its; non-blocking streams wait for neither.
//   - Device memory lives at addresses the process cannot touch (a reserved PROT_NONE range), so
//     host code that dereferences a device pointer crashes here as it would on a GPU.
// Pinned and managed memory are ordinary host memory. Copies are memcpy on the queue's thread.
//   - A queue holds at most 1024 pending ops (FERRY_FAKE_CUDA_QUEUE_DEPTH): queueing on a full
//     one blocks the caller until an op has run, as CUDA's does (on the H200 a stream held back
//     by a wait blocked its caller after about a thousand queued ops).
// Environment: FERRY_FAKE_CUDA_GPUS (devices), FERRY_FAKE_CUDA_GPU_MEMORY (bytes per device,
// default 64 GiB of address space), CUDA_DEVICE_MAX_CONNECTIONS (queues, 1 to 32). Their defaults
// (1 device, 8 queues) are build-time macros, FERRY_FAKE_CUDA_DEFAULT_GPUS and
// FERRY_FAKE_CUDA_DEFAULT_QUEUES, so that CTest can run variants with one variable set
// (FERRY_CUDA_LIBRARY naming the variant).
#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda/cuda_abi.h"

#ifndef FERRY_FAKE_CUDA_DEFAULT_GPUS
#define FERRY_FAKE_CUDA_DEFAULT_GPUS 1
#endif
#ifndef FERRY_FAKE_CUDA_DEFAULT_QUEUES
#define FERRY_FAKE_CUDA_DEFAULT_QUEUES 8
#endif

namespace abi = ferry::cuda::abi;
using abi::Result;

namespace {

constexpr Result kInvalidValue = static_cast<Result>(1);
constexpr Result kNotInitialized = static_cast<Result>(3);
constexpr Result kInvalidContext = static_cast<Result>(201);
constexpr Result kInvalidHandle = static_cast<Result>(400);
constexpr Result kNotPermitted = static_cast<Result>(800);

long env_long(const char* name, long fallback, long lo, long hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi) {
    std::fprintf(stderr, "fake libcuda: %s=%s is not a number in [%ld, %ld]\n", name, v, lo, hi);
    std::abort();
  }
  return x;
}

struct Context {
  int device;
};

struct Stream;

// One unit of queued work. `after`: work of other streams that must have finished first (the
// legacy default stream's implicit synchronisation).
struct Op {
  enum Kind { kCopy, kSet, kMark, kHostFn, kWait } kind;
  Stream* stream = nullptr;
  std::uint64_t seq = 0;
  std::vector<std::pair<Stream*, std::uint64_t>> after;
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
  unsigned char value = 0;
  abi::HostFn fn = nullptr;
  void* data = nullptr;
  const std::uint32_t* word = nullptr;
  std::uint32_t wait_for = 0;
};

struct Stream {
  Context* context;
  bool legacy;
  bool non_blocking;
  int queue;
  std::uint64_t queued = 0;  // ops queued so far; guarded by State::mu
  std::uint64_t done = 0;    // ops finished (in order)
};

struct Event {
  Stream* stream = nullptr;
  std::uint64_t seq = 0;
};

struct Allocation {
  std::size_t bytes;
  unsigned int memory_type;  // abi::kMemoryTypeHost or kMemoryTypeDevice
  bool managed;
  int device;
  void* storage;    // where a device allocation's bytes really are
  bool registered;  // host memory of the caller's, pinned by cuMemHostRegister (not ours to free)
};

// Device addresses: a reserved range nothing can touch; allocations take it bump-wise (small
// ones packed, large ones 64 KiB aligned) and are never given out twice. 256 GiB where the address
// space allows, less under ThreadSanitizer, whose shadow memory leaves applications a smaller one
// (State::device_range).

// cuMemAlloc packs allocations below kPackedBelow at kPackedGrain (cuMemAlloc_v2).
constexpr std::size_t kPackedBelow = std::size_t{2} << 20;
constexpr std::size_t kPackedGrain = 512;

struct State {
  std::mutex mu;
  std::condition_variable changed;  // any op finished, any op queued
  int devices = 1;
  std::size_t device_memory = 0;
  std::vector<Context*> contexts;
  std::vector<Stream*> legacy;                 // per device
  std::vector<std::vector<Stream*>> blocking;  // per device: streams made without NonBlocking
  std::vector<Stream*> made;                   // every stream made by cuStreamCreate
  int queues = 8;
  std::size_t queue_depth = 1024;  // ops a queue holds before queueing blocks
  int next_queue = 1;
  std::vector<std::deque<Op>> queue_ops;
  std::vector<bool> queue_started;
  std::uintptr_t device_base = 0;
  std::size_t device_range = 0;
  std::uintptr_t device_next = 0;
  std::vector<std::size_t> device_used;
  std::map<std::uintptr_t, Allocation> allocations;  // by start address
  // The one host-function thread.
  std::deque<Op> host_fns;
  std::uint64_t host_fns_done = 0, host_fns_posted = 0;
};

State* state = nullptr;  // set by cuInit; leaked (threads run while the process exits)
// The current context of each thread, in a pthread key rather than thread_local: this library is
// dlopen()ed, so thread_local would be dynamic TLS, which g++ 12's LeakSanitizer crashes on while
// it scans threads at exit (seen in CI: "Tracer caught signal 11").
pthread_key_t current_key;
std::once_flag current_key_once;
Context* current_ctx() {
  std::call_once(current_key_once, [] { pthread_key_create(&current_key, nullptr); });
  return static_cast<Context*>(pthread_getspecific(current_key));
}
void set_current(Context* c) {
  current_ctx();  // the key exists
  pthread_setspecific(current_key, c);
}
// The host-function thread: driver calls from it fail, as CUDA's do from a host function.
std::atomic<bool> host_thread_known{false};
pthread_t host_thread;
bool in_host_fn() {
  return host_thread_known.load(std::memory_order_acquire) &&
         pthread_equal(pthread_self(), host_thread);
}

// Every entry point but cuInit and the error texts starts with this.
#define FAKE_ENTER()                              \
  do {                                            \
    if (state == nullptr) return kNotInitialized; \
    if (in_host_fn()) return kNotPermitted;       \
  } while (0)

const Allocation* find(std::uintptr_t p, std::uintptr_t* start) {
  auto it = state->allocations.upper_bound(p);
  if (it == state->allocations.begin()) return nullptr;
  --it;
  if (p >= it->first + it->second.bytes && !(p == it->first && it->second.bytes == 0)) {
    return nullptr;
  }
  if (start != nullptr) *start = it->first;
  return &it->second;
}

// Where the host can touch `bytes` bytes at address `p`: device addresses are translated to
// their storage; any other address is taken as host memory. Null for a range that runs past a
// device allocation or lies in the device range unallocated.
void* host_view(std::uintptr_t p, std::size_t bytes) {
  if (p >= state->device_base && p < state->device_base + state->device_range) {
    std::uintptr_t start = 0;
    const Allocation* a = find(p, &start);
    if (a == nullptr || a->memory_type != abi::kMemoryTypeDevice || bytes > a->bytes - (p - start))
      return nullptr;
    return static_cast<char*>(a->storage) + (p - start);
  }
  return reinterpret_cast<void*>(p);
}

void run_host_fns() {
  host_thread = pthread_self();
  host_thread_known.store(true, std::memory_order_release);
  for (;;) {
    Op op;
    {
      std::unique_lock lock(state->mu);
      state->changed.wait(lock, [] { return !state->host_fns.empty(); });
      op = state->host_fns.front();
      state->host_fns.pop_front();
    }
    op.fn(op.data);
    std::lock_guard lock(state->mu);
    ++state->host_fns_done;
    state->changed.notify_all();
  }
}

bool ready(const Op& op) {
  for (const auto& [s, seq] : op.after)
    if (s->done < seq) return false;
  if (op.kind == Op::kWait) {
    const std::uint32_t now =
        std::atomic_ref<std::uint32_t>(*const_cast<std::uint32_t*>(op.word)).load();
    return static_cast<std::int32_t>(now - op.wait_for) >= 0;
  }
  return true;
}

// One hardware queue: runs its ops strictly in the order they were queued.
void run_queue(int q) {
  std::unique_lock lock(state->mu);
  for (;;) {
    std::deque<Op>& ops = state->queue_ops[q];
    if (ops.empty()) {
      state->changed.wait(lock);
      continue;
    }
    if (!ready(ops.front())) {
      // A flag in host memory changes without a notification: poll it, as the GPU does.
      state->changed.wait_for(lock, std::chrono::microseconds(100));
      continue;
    }
    Op op = ops.front();
    ops.pop_front();
    if (op.kind == Op::kHostFn) {
      const std::uint64_t ticket = ++state->host_fns_posted;
      state->host_fns.push_back(op);
      state->changed.notify_all();
      state->changed.wait(lock, [&] { return state->host_fns_done >= ticket; });
    } else {
      lock.unlock();
      if (op.kind == Op::kCopy) std::memmove(op.dst, op.src, op.bytes);
      if (op.kind == Op::kSet) std::memset(op.dst, op.value, op.bytes);
      lock.lock();
    }
    op.stream->done = op.seq;
    state->changed.notify_all();
  }
}

// The stream a handle names: 0 and CU_STREAM_LEGACY (1) are the current context's legacy
// default stream; CU_STREAM_PER_THREAD (2) is taken as it too (ferry does not use it).
Stream* resolve(abi::Stream handle, Result* error) {
  const auto h = reinterpret_cast<std::uintptr_t>(handle);
  if (h == 0 || h == 1 || h == 2) {
    if (current_ctx() == nullptr) {
      *error = kInvalidContext;
      return nullptr;
    }
    return state->legacy[current_ctx()->device];
  }
  return reinterpret_cast<Stream*>(handle);
}

// Queues `op` on `s` under the lock; the legacy stream's implicit ordering becomes `after`.
// Waits first while the stream's queue holds queue_depth ops, as CUDA blocks a caller who queues
// on a full queue.
std::uint64_t enqueue(std::unique_lock<std::mutex>& lock, Stream* s, Op op) {
  state->changed.wait(lock, [&] { return state->queue_ops[s->queue].size() < state->queue_depth; });
  const int dev = s->context->device;
  if (s->legacy) {
    for (Stream* b : state->blocking[dev]) op.after.emplace_back(b, b->queued);
  } else if (!s->non_blocking) {
    Stream* l = state->legacy[dev];
    op.after.emplace_back(l, l->queued);
  }
  op.stream = s;
  op.seq = ++s->queued;
  if (!state->queue_started[s->queue]) {
    state->queue_started[s->queue] = true;
    std::thread(run_queue, s->queue).detach();
  }
  const std::uint64_t seq = op.seq;
  state->queue_ops[s->queue].push_back(std::move(op));
  state->changed.notify_all();
  return seq;
}

void wait_done(std::unique_lock<std::mutex>& lock, Stream* s, std::uint64_t seq) {
  state->changed.wait(lock, [&] { return s->done >= seq; });
}

// Waits until every op queued so far, on every stream, has finished (cuMemFree's synchronisation).
void wait_all(std::unique_lock<std::mutex>& lock) {
  std::vector<std::pair<Stream*, std::uint64_t>> targets;
  for (Stream* s : state->legacy) targets.emplace_back(s, s->queued);
  for (Stream* s : state->made) targets.emplace_back(s, s->queued);
  for (auto& [s, seq] : targets) wait_done(lock, s, seq);
}

Stream* make_stream(Context* c, bool legacy, bool non_blocking) {
  auto* s = new Stream{c, legacy, non_blocking, 0};
  if (legacy) {
    s->queue = 0;
  } else {
    s->queue = state->next_queue % state->queues;
    state->next_queue++;
  }
  return s;
}

// The synchronous calls (cuMemcpyHtoD, cuMemcpyDtoH, cuMemsetD8) run on the legacy default
// stream and return once done.
Result run_sync(Op op) {
  if (current_ctx() == nullptr) return kInvalidContext;
  std::unique_lock lock(state->mu);
  Stream* s = state->legacy[current_ctx()->device];
  wait_done(lock, s, enqueue(lock, s, std::move(op)));
  return abi::kSuccess;
}

Result copy_op(std::uintptr_t dst, std::uintptr_t src, std::size_t bytes, Op* op) {
  void* d = host_view(dst, bytes);
  void* s = host_view(src, bytes);
  if (d == nullptr || s == nullptr) return kInvalidValue;
  op->kind = Op::kCopy;
  op->dst = d;
  op->src = s;
  op->bytes = bytes;
  return abi::kSuccess;
}

Result queue_copy(std::uintptr_t dst, std::uintptr_t src, std::size_t bytes, abi::Stream stream) {
  FAKE_ENTER();
  std::unique_lock lock(state->mu);
  Result r = abi::kSuccess;
  Stream* s = resolve(stream, &r);
  if (s == nullptr) return r;
  Op op;
  if (Result c = copy_op(dst, src, bytes, &op); c != abi::kSuccess) return c;
  enqueue(lock, s, std::move(op));
  return abi::kSuccess;
}

Result sync_copy(std::uintptr_t dst, std::uintptr_t src, std::size_t bytes) {
  FAKE_ENTER();
  Op op;
  {
    std::lock_guard lock(state->mu);
    if (Result c = copy_op(dst, src, bytes, &op); c != abi::kSuccess) return c;
  }
  return run_sync(std::move(op));
}

}  // namespace

#define FAKE_API extern "C" __attribute__((visibility("default")))

FAKE_API Result cuInit(unsigned int flags) {
  if (flags != 0) return kInvalidValue;
  static std::once_flag once;
  std::call_once(once, [] {
    auto* s = new State;
    s->devices =
        static_cast<int>(env_long("FERRY_FAKE_CUDA_GPUS", FERRY_FAKE_CUDA_DEFAULT_GPUS, 0, 16));
    s->device_memory =
        static_cast<std::size_t>(env_long("FERRY_FAKE_CUDA_GPU_MEMORY", 64L << 30, 1, 1L << 40));
    s->queues = static_cast<int>(
        env_long("CUDA_DEVICE_MAX_CONNECTIONS", FERRY_FAKE_CUDA_DEFAULT_QUEUES, 1, 32));
    s->queue_depth =
        static_cast<std::size_t>(env_long("FERRY_FAKE_CUDA_QUEUE_DEPTH", 1024, 1, 1L << 20));
    s->queue_ops.resize(s->queues);
    s->queue_started.assign(s->queues, false);
    void* range = MAP_FAILED;
    for (std::size_t bytes = std::size_t{256} << 30; range == MAP_FAILED && bytes >= (4UL << 30);
         bytes /= 4) {
      range = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      s->device_range = bytes;
    }
    if (range == MAP_FAILED) {
      std::perror("fake libcuda: reserving the device address range");
      std::abort();
    }
    s->device_base = s->device_next = reinterpret_cast<std::uintptr_t>(range);
    s->device_used.assign(s->devices, 0);
    s->blocking.resize(s->devices);
    state = s;  // make_stream reads it
    for (int i = 0; i < s->devices; ++i) {
      s->contexts.push_back(new Context{i});
      s->legacy.push_back(make_stream(s->contexts.back(), true, false));
    }
    std::thread(run_host_fns).detach();
  });
  return abi::kSuccess;
}

FAKE_API Result cuDriverGetVersion(int* version) {
  *version = 13000;
  return abi::kSuccess;
}

FAKE_API Result cuGetErrorName(Result error, const char** text) {
  switch (static_cast<unsigned>(error)) {
    case 0:
      *text = "CUDA_SUCCESS";
      break;
    case 1:
      *text = "CUDA_ERROR_INVALID_VALUE";
      break;
    case 2:
      *text = "CUDA_ERROR_OUT_OF_MEMORY";
      break;
    case 3:
      *text = "CUDA_ERROR_NOT_INITIALIZED";
      break;
    case 101:
      *text = "CUDA_ERROR_INVALID_DEVICE";
      break;
    case 201:
      *text = "CUDA_ERROR_INVALID_CONTEXT";
      break;
    case 400:
      *text = "CUDA_ERROR_INVALID_HANDLE";
      break;
    case 800:
      *text = "CUDA_ERROR_NOT_PERMITTED";
      break;
    default:
      *text = nullptr;
      return kInvalidValue;
  }
  return abi::kSuccess;
}

FAKE_API Result cuGetErrorString(Result error, const char** text) {
  const char* name = nullptr;
  Result r = cuGetErrorName(error, &name);
  *text = name == nullptr ? nullptr : "(fake libcuda)";
  return r;
}

FAKE_API Result cuDeviceGetCount(int* count) {
  FAKE_ENTER();
  *count = state->devices;
  return abi::kSuccess;
}

FAKE_API Result cuDeviceGet(abi::Device* device, int ordinal) {
  FAKE_ENTER();
  if (ordinal < 0 || ordinal >= state->devices) return abi::kErrorInvalidDevice;
  *device = ordinal;
  return abi::kSuccess;
}

FAKE_API Result cuDeviceGetName(char* name, int len, abi::Device device) {
  FAKE_ENTER();
  if (device < 0 || device >= state->devices) return abi::kErrorInvalidDevice;
  std::snprintf(name, len, "ferry fake GPU %d", device);
  return abi::kSuccess;
}

FAKE_API Result cuDeviceGetPCIBusId(char* bus_id, int len, abi::Device device) {
  FAKE_ENTER();
  if (device < 0 || device >= state->devices) return abi::kErrorInvalidDevice;
  std::snprintf(bus_id, len, "0000:%02x:00.0", 0xf0 + device);  // on no bus of this machine
  return abi::kSuccess;
}

FAKE_API Result cuDeviceTotalMem_v2(std::size_t* bytes, abi::Device device) {
  FAKE_ENTER();
  if (device < 0 || device >= state->devices) return abi::kErrorInvalidDevice;
  *bytes = state->device_memory;
  return abi::kSuccess;
}

FAKE_API Result cuDeviceGetUuid_v2(abi::Uuid* uuid, abi::Device device) {
  FAKE_ENTER();
  if (device < 0 || device >= state->devices) return abi::kErrorInvalidDevice;
  char text[32] = {};
  std::snprintf(text, sizeof text, "fake-cuda-gpu%02d", device);
  std::memcpy(uuid->bytes, text, sizeof uuid->bytes);
  return abi::kSuccess;
}

FAKE_API Result cuDevicePrimaryCtxRetain(abi::Context* context, abi::Device device) {
  FAKE_ENTER();
  if (device < 0 || device >= state->devices) return abi::kErrorInvalidDevice;
  *context = reinterpret_cast<abi::Context>(state->contexts[device]);
  return abi::kSuccess;
}

FAKE_API Result cuDevicePrimaryCtxRelease_v2(abi::Device device) {
  FAKE_ENTER();
  return device < 0 || device >= state->devices ? abi::kErrorInvalidDevice : abi::kSuccess;
}

FAKE_API Result cuDevicePrimaryCtxReset_v2(abi::Device device) {
  FAKE_ENTER();
  return device < 0 || device >= state->devices ? abi::kErrorInvalidDevice : abi::kSuccess;
}

FAKE_API Result cuCtxSetCurrent(abi::Context context) {
  FAKE_ENTER();
  set_current(reinterpret_cast<Context*>(context));
  return abi::kSuccess;
}

FAKE_API Result cuCtxGetCurrent(abi::Context* context) {
  FAKE_ENTER();
  *context = reinterpret_cast<abi::Context>(current_ctx());
  return abi::kSuccess;
}

FAKE_API Result cuPointerGetAttributes(unsigned int count, abi::PointerAttribute* attributes,
                                       void** data, abi::DevicePtr ptr) {
  FAKE_ENTER();
  std::lock_guard lock(state->mu);
  const Allocation* a = find(static_cast<std::uintptr_t>(ptr), nullptr);
  for (unsigned int i = 0; i < count; ++i) {
    switch (attributes[i]) {
      case abi::kPointerAttributeMemoryType:
        *static_cast<unsigned int*>(data[i]) = a ? a->memory_type : 0;
        break;
      case abi::kPointerAttributeDeviceOrdinal:
        *static_cast<int*>(data[i]) = a ? a->device : -2;
        break;
      case abi::kPointerAttributeIsManaged:
        *static_cast<unsigned int*>(data[i]) = a && a->managed ? 1 : 0;
        break;
      default:
        return kInvalidValue;
    }
  }
  return abi::kSuccess;
}

namespace {
Result host_allocation(void* p, std::size_t bytes, bool managed, bool registered = false) {
  std::lock_guard lock(state->mu);
  state->allocations[reinterpret_cast<std::uintptr_t>(p)] =
      Allocation{.bytes = bytes,
                 .memory_type = managed ? abi::kMemoryTypeDevice : abi::kMemoryTypeHost,
                 .managed = managed,
                 .device = current_ctx()->device,
                 .storage = nullptr,
                 .registered = registered};
  return abi::kSuccess;
}

// cuMemFreeHost (`registered` false) and cuMemHostUnregister (true): each takes back only what
// its counterpart made, as CUDA's do.
Result forget_host(void* ptr, bool registered) {
  std::lock_guard lock(state->mu);
  auto it = state->allocations.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == state->allocations.end() || it->second.memory_type != abi::kMemoryTypeHost ||
      it->second.registered != registered)
    return kInvalidValue;
  state->allocations.erase(it);
  if (!registered) std::free(ptr);
  return abi::kSuccess;
}
}  // namespace

FAKE_API Result cuMemAlloc_v2(abi::DevicePtr* ptr, std::size_t bytes) {
  FAKE_ENTER();
  if (current_ctx() == nullptr) return kInvalidContext;
  if (bytes == 0) return kInvalidValue;
  std::lock_guard lock(state->mu);
  const int dev = current_ctx()->device;
  if (bytes > state->device_memory - state->device_used[dev]) return abi::kErrorOutOfMemory;
  // As CUDA's allocator does, small allocations are packed one after the other (at its 512-byte
  // granularity), so that two of them can be adjacent in address space and a copy running from
  // one into the next fails as on a GPU (host_view); large ones start on a 64 KiB boundary.
  const bool small = bytes < kPackedBelow;
  const std::size_t grain = small ? kPackedGrain : std::size_t{0x10000};
  const std::uintptr_t p = (state->device_next + grain - 1) & ~std::uintptr_t{grain - 1};
  const std::size_t span = (bytes + grain - 1) & ~std::size_t{grain - 1};
  if (p + span > state->device_base + state->device_range) return abi::kErrorOutOfMemory;
  void* storage = std::malloc(bytes);
  if (storage == nullptr) return abi::kErrorOutOfMemory;
  std::memset(storage, 0xd0, bytes);  // fresh device memory holds no zeros to rely on
  state->device_next = p + span;
  state->device_used[dev] += bytes;
  state->allocations[p] = Allocation{bytes, abi::kMemoryTypeDevice, false, dev, storage, false};
  *ptr = p;
  return abi::kSuccess;
}

FAKE_API Result cuMemAllocManaged(abi::DevicePtr* ptr, std::size_t bytes, unsigned int) {
  FAKE_ENTER();
  if (current_ctx() == nullptr) return kInvalidContext;
  if (bytes == 0) return kInvalidValue;
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) return abi::kErrorOutOfMemory;
  *ptr = reinterpret_cast<abi::DevicePtr>(p);
  return host_allocation(p, bytes, true);
}

FAKE_API Result cuMemFree_v2(abi::DevicePtr ptr) {
  FAKE_ENTER();
  std::unique_lock lock(state->mu);
  auto it = state->allocations.find(static_cast<std::uintptr_t>(ptr));
  if (it == state->allocations.end() || it->second.memory_type != abi::kMemoryTypeDevice)
    return kInvalidValue;
  wait_all(lock);  // cuMemFree synchronises: no queued copy may still use the memory
  it = state->allocations.find(static_cast<std::uintptr_t>(ptr));
  if (it == state->allocations.end()) return kInvalidValue;
  Allocation a = it->second;
  state->allocations.erase(it);
  if (a.managed) {
    std::free(reinterpret_cast<void*>(ptr));
  } else {
    state->device_used[a.device] -= a.bytes;
    std::free(a.storage);
  }
  return abi::kSuccess;
}

// cuMemHostAlloc calls that succeeded, for the tests (dlsym): pinned memory allocated per save.
std::atomic<unsigned long long> host_allocs{0};
FAKE_API unsigned long long ferry_fake_cuda_host_allocs() { return host_allocs.load(); }

FAKE_API Result cuMemHostAlloc(void** ptr, std::size_t bytes, unsigned int) {
  FAKE_ENTER();
  if (current_ctx() == nullptr) return kInvalidContext;
  if (bytes == 0) return kInvalidValue;
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) return abi::kErrorOutOfMemory;
  *ptr = p;
  host_allocs.fetch_add(1);
  return host_allocation(p, bytes, false);
}

FAKE_API Result cuMemFreeHost(void* ptr) {
  FAKE_ENTER();
  return forget_host(ptr, false);
}

FAKE_API Result cuMemHostRegister_v2(void* ptr, std::size_t bytes, unsigned int) {
  FAKE_ENTER();
  if (current_ctx() == nullptr) return kInvalidContext;
  if (bytes == 0) return kInvalidValue;
  {
    std::lock_guard lock(state->mu);
    if (find(reinterpret_cast<std::uintptr_t>(ptr), nullptr) != nullptr) return kInvalidValue;
  }
  return host_allocation(ptr, bytes, false, true);
}

FAKE_API Result cuMemHostUnregister(void* ptr) {
  FAKE_ENTER();
  return forget_host(ptr, true);
}

FAKE_API Result cuMemHostGetDevicePointer_v2(abi::DevicePtr* device_ptr, void* host_ptr,
                                             unsigned int flags) {
  FAKE_ENTER();
  if (flags != 0) return kInvalidValue;
  std::lock_guard lock(state->mu);
  const Allocation* a = find(reinterpret_cast<std::uintptr_t>(host_ptr), nullptr);
  if (a == nullptr || a->memory_type != abi::kMemoryTypeHost) return kInvalidValue;
  *device_ptr = reinterpret_cast<abi::DevicePtr>(host_ptr);  // unified addressing
  return abi::kSuccess;
}

FAKE_API Result cuMemcpyHtoDAsync_v2(abi::DevicePtr dst, const void* src, std::size_t bytes,
                                     abi::Stream stream) {
  return queue_copy(dst, reinterpret_cast<std::uintptr_t>(src), bytes, stream);
}

FAKE_API Result cuMemcpyDtoHAsync_v2(void* dst, abi::DevicePtr src, std::size_t bytes,
                                     abi::Stream stream) {
  return queue_copy(reinterpret_cast<std::uintptr_t>(dst), src, bytes, stream);
}

FAKE_API Result cuMemcpyHtoD_v2(abi::DevicePtr dst, const void* src, std::size_t bytes) {
  return sync_copy(dst, reinterpret_cast<std::uintptr_t>(src), bytes);
}

FAKE_API Result cuMemcpyDtoH_v2(void* dst, abi::DevicePtr src, std::size_t bytes) {
  return sync_copy(reinterpret_cast<std::uintptr_t>(dst), src, bytes);
}

FAKE_API Result cuMemsetD8_v2(abi::DevicePtr dst, unsigned char value, std::size_t count) {
  FAKE_ENTER();
  Op op;
  {
    std::lock_guard lock(state->mu);
    op.dst = host_view(dst, count);
    if (op.dst == nullptr) return kInvalidValue;
  }
  op.kind = Op::kSet;
  op.value = value;
  op.bytes = count;
  return run_sync(std::move(op));
}

FAKE_API Result cuStreamCreate(abi::Stream* stream, unsigned int flags) {
  FAKE_ENTER();
  if (current_ctx() == nullptr) return kInvalidContext;
  if ((flags & ~abi::kStreamNonBlocking) != 0) return kInvalidValue;
  std::lock_guard lock(state->mu);
  Stream* s = make_stream(current_ctx(), false, (flags & abi::kStreamNonBlocking) != 0);
  if (!s->non_blocking) state->blocking[current_ctx()->device].push_back(s);
  state->made.push_back(s);
  *stream = reinterpret_cast<abi::Stream>(s);
  return abi::kSuccess;
}

// The stream object is kept (its queued work still runs, as CUDA lets it); the handle must not
// be used again.
FAKE_API Result cuStreamDestroy_v2(abi::Stream stream) {
  FAKE_ENTER();
  const auto h = reinterpret_cast<std::uintptr_t>(stream);
  return h <= 2 ? kInvalidHandle : abi::kSuccess;
}

FAKE_API Result cuStreamSynchronize(abi::Stream stream) {
  FAKE_ENTER();
  std::unique_lock lock(state->mu);
  Result r = abi::kSuccess;
  Stream* s = resolve(stream, &r);
  if (s == nullptr) return r;
  wait_done(lock, s, s->queued);
  return abi::kSuccess;
}

// Not called by ferry; tests call it (through dlsym) to wait for ferry's own streams' copies.
FAKE_API Result cuCtxSynchronize() {
  FAKE_ENTER();
  if (current_ctx() == nullptr) return kInvalidContext;
  std::unique_lock lock(state->mu);
  wait_all(lock);
  return abi::kSuccess;
}

FAKE_API Result cuStreamGetCtx(abi::Stream stream, abi::Context* context) {
  FAKE_ENTER();
  Result r = abi::kSuccess;
  Stream* s = resolve(stream, &r);
  if (s == nullptr) return r;
  *context = reinterpret_cast<abi::Context>(s->context);
  return abi::kSuccess;
}

FAKE_API Result cuStreamIsCapturing(abi::Stream stream, abi::StreamCaptureStatus* status) {
  FAKE_ENTER();
  Result r = abi::kSuccess;
  if (resolve(stream, &r) == nullptr) return r;
  *status = abi::kStreamCaptureStatusNone;
  return abi::kSuccess;
}

FAKE_API Result cuEventCreate(abi::Event* event, unsigned int) {
  FAKE_ENTER();
  *event = reinterpret_cast<abi::Event>(new Event);
  return abi::kSuccess;
}

FAKE_API Result cuEventDestroy_v2(abi::Event event) {
  FAKE_ENTER();
  delete reinterpret_cast<Event*>(event);
  return abi::kSuccess;
}

FAKE_API Result cuEventRecord(abi::Event event, abi::Stream stream) {
  FAKE_ENTER();
  std::unique_lock lock(state->mu);
  Result r = abi::kSuccess;
  Stream* s = resolve(stream, &r);
  if (s == nullptr) return r;
  Op op;
  op.kind = Op::kMark;
  const std::uint64_t seq = enqueue(lock, s, std::move(op));
  auto* e = reinterpret_cast<Event*>(event);
  e->stream = s;
  e->seq = seq;
  return abi::kSuccess;
}

FAKE_API Result cuEventSynchronize(abi::Event event) {
  FAKE_ENTER();
  std::unique_lock lock(state->mu);
  auto* e = reinterpret_cast<Event*>(event);
  if (e->stream != nullptr) wait_done(lock, e->stream, e->seq);
  return abi::kSuccess;
}

// The stream's later work waits for the event's work: a mark queued after it.
FAKE_API Result cuStreamWaitEvent(abi::Stream stream, abi::Event event, unsigned int flags) {
  FAKE_ENTER();
  if (flags != 0) return kInvalidValue;
  std::unique_lock lock(state->mu);
  Result r = abi::kSuccess;
  Stream* s = resolve(stream, &r);
  if (s == nullptr) return r;
  auto* e = reinterpret_cast<Event*>(event);
  Op op;
  op.kind = Op::kMark;
  if (e->stream != nullptr) op.after.emplace_back(e->stream, e->seq);
  enqueue(lock, s, std::move(op));
  return abi::kSuccess;
}

FAKE_API Result cuLaunchHostFunc(abi::Stream stream, abi::HostFn fn, void* user_data) {
  FAKE_ENTER();
  std::unique_lock lock(state->mu);
  Result r = abi::kSuccess;
  Stream* s = resolve(stream, &r);
  if (s == nullptr) return r;
  Op op;
  op.kind = Op::kHostFn;
  op.fn = fn;
  op.data = user_data;
  enqueue(lock, s, std::move(op));
  return abi::kSuccess;
}

FAKE_API Result cuStreamWaitValue32_v2(abi::Stream stream, abi::DevicePtr address,
                                       std::uint32_t value, unsigned int flags) {
  FAKE_ENTER();
  if (flags != abi::kStreamWaitValueGeq) return kInvalidValue;
  std::unique_lock lock(state->mu);
  Result r = abi::kSuccess;
  Stream* s = resolve(stream, &r);
  if (s == nullptr) return r;
  void* word = host_view(address, sizeof(std::uint32_t));
  if (word == nullptr) return kInvalidValue;
  Op op;
  op.kind = Op::kWait;
  op.word = static_cast<const std::uint32_t*>(word);
  op.wait_for = value;
  enqueue(lock, s, std::move(op));
  return abi::kSuccess;
}
