#include "cuda/stream_order.h"

#include <mutex>
#include <vector>

#include "cuda/cuda_driver.h"
#include "ferry/error.h"

namespace ferry::cuda {
namespace {

// Slots of mapped, portable pinned memory, 4 KiB pages of 1024. A slot's value only grows: the
// stream waits for value >= its request's number (wrapping, as GEQ compares), so a slot is
// reused as soon as its request has set it, whether or not its stream has passed the wait yet.
class GateSlots {
 public:
  struct Slot {
    std::size_t index;
    std::uint32_t* host;
    abi::DevicePtr device;
    std::uint32_t value;  // the value that opens this use of the slot
  };

  // A current CUDA context is needed to allocate the first page.
  Slot acquire() {
    std::lock_guard lock(mu_);
    if (free_.empty()) grow();
    const std::size_t i = free_.back();
    free_.pop_back();
    ++in_use_;
    const std::uint32_t value = ++next_[i];
    return {i, host_[i], device_[i], value};
  }

  void release(std::size_t index) {
    std::lock_guard lock(mu_);
    free_.push_back(index);
    --in_use_;
  }

  std::size_t in_use() const {
    std::lock_guard lock(mu_);
    return in_use_;
  }

 private:
  static constexpr std::size_t kPerPage = 1024;

  void grow() {
    const Driver& d = driver();
    void* page = nullptr;
    check(d.MemHostAlloc(&page, kPerPage * sizeof(std::uint32_t),
                         abi::kMemHostAllocPortable | abi::kMemHostAllocDeviceMap),
          "cuMemHostAlloc (stream-order flags)");
    abi::DevicePtr base = 0;
    abi::Result r = d.MemHostGetDevicePointer(&base, page, 0);
    if (r != abi::kSuccess) {
      d.MemFreeHost(page);
      check(r, "cuMemHostGetDevicePointer (stream-order flags)");
    }
    // Kept for the life of the process: a stream may still wait on a slot at exit.
    auto* words = static_cast<std::uint32_t*>(page);
    for (std::size_t k = 0; k < kPerPage; ++k) {
      words[k] = 0;
      host_.push_back(words + k);
      device_.push_back(base + k * sizeof(std::uint32_t));
      next_.push_back(0);
      free_.push_back(host_.size() - 1);
    }
  }

  mutable std::mutex mu_;
  std::vector<std::uint32_t*> host_;
  std::vector<abi::DevicePtr> device_;
  std::vector<std::uint32_t> next_;
  std::vector<std::size_t> free_;
  std::size_t in_use_ = 0;
};

std::atomic<bool> skip_waits{false};

GateSlots& gates() {
  static auto* g = new GateSlots;  // leaked: streams may wait on its pages while the process exits
  return *g;
}

// Puts the caller's context back when a scope ends.
class KeepContext {
 public:
  explicit KeepContext(const Driver& d) : d_(d) { d_.CtxGetCurrent(&saved_); }
  ~KeepContext() { d_.CtxSetCurrent(saved_); }
  KeepContext(const KeepContext&) = delete;
  KeepContext& operator=(const KeepContext&) = delete;

 private:
  const Driver& d_;
  abi::Context saved_ = nullptr;
};

}  // namespace

StreamOrder::StreamOrder(abi::Stream stream, int device) : stream_(stream) {
  const Driver& d = driver();
  KeepContext keep(d);
  // The stream's context: for the legacy default stream (0), the one current on this thread,
  // which is the buffer's GPU's when the caller has none.
  abi::Context current = nullptr;
  d.CtxGetCurrent(&current);
  if (current == nullptr) use_device(device >= 0 ? device : 0);
  check(d.StreamGetCtx(stream, &context_), "cuStreamGetCtx (the stream given to read_async)");
  check(d.CtxSetCurrent(context_), "cuCtxSetCurrent (the stream's context)");
  check(d.EventCreate(&before_, abi::kEventDisableTiming), "cuEventCreate");
  abi::Result r = d.EventRecord(before_, stream);
  if (r != abi::kSuccess) {
    d.EventDestroy(before_);
    check(r, "cuEventRecord (on the stream given to read_async)");
  }
  GateSlots::Slot slot;
  try {
    slot = gates().acquire();
  } catch (...) {
    d.EventDestroy(before_);
    throw;
  }
  r = d.StreamWaitValue32(stream, slot.device, slot.value, abi::kStreamWaitValueGeq);
  if (r != abi::kSuccess) {
    d.EventDestroy(before_);
    gates().release(slot.index);
    throw CudaError(describe(r,
                             "cuStreamWaitValue32 (ordering the stream's later work after "
                             "the request; this GPU or driver refuses stream memory "
                             "operations)"),
                    static_cast<int>(r));
  }
  flag_ = slot.host;
  value_ = slot.value;
  slot_ = slot.index;
}

StreamOrder::~StreamOrder() {
  release();
  if (const Driver* d = driver_or_null()) d->EventDestroy(before_);
}

void StreamOrder::wait_before() const {
  if (passed_.load(std::memory_order_acquire) || skip_waits.load(std::memory_order_relaxed)) return;
  const Driver& d = driver();
  abi::Context current = nullptr;
  d.CtxGetCurrent(&current);
  if (current == nullptr)
    check(d.CtxSetCurrent(context_), "cuCtxSetCurrent (the stream's context)");
  check(d.EventSynchronize(before_),
        "cuEventSynchronize (the work queued on the stream before the request)");
  passed_.store(true, std::memory_order_release);
}

void StreamOrder::release() noexcept {
  if (released_.exchange(true, std::memory_order_acq_rel)) return;
  // Every byte the request wrote (GPU copies completed, host stores) happens before the store the
  // GPU polls for.
  std::atomic_ref<std::uint32_t>(*flag_).store(value_, std::memory_order_seq_cst);
  gates().release(slot_);
}

std::size_t stream_gates_in_use() { return gates().in_use(); }

void testing::skip_waits_before(bool skip) { skip_waits.store(skip); }

}  // namespace ferry::cuda
