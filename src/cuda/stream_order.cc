#include "cuda/stream_order.h"

#include <memory>
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

std::atomic<bool> at_once{false};
std::atomic<std::uint64_t> host_queued{0};
std::atomic<std::uint64_t> host_run{0};

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

// What the host function queued on the stream carries: the request's start, which runs once,
// unless begin() abandoned it first.
struct HostStart {
  enum State { kPending, kStarted, kAbandoned };
  std::function<void()> start;
  std::atomic<int> state{kPending};
};

void run_host_start(void* data) {
  host_run.fetch_add(1, std::memory_order_relaxed);
  std::unique_ptr<std::shared_ptr<HostStart>> ref(static_cast<std::shared_ptr<HostStart>*>(data));
  int pending = HostStart::kPending;
  if ((*ref)->state.compare_exchange_strong(pending, HostStart::kStarted)) (*ref)->start();
}

// Makes current the context of `stream` (for the legacy default stream, the one current on
// this thread, or `device`'s when there is none).
void use_stream_context(const Driver& d, abi::Stream stream, int device) {
  abi::Context current = nullptr;
  d.CtxGetCurrent(&current);
  if (current == nullptr) use_device(device >= 0 ? device : 0);
  abi::Context context = nullptr;
  check(d.StreamGetCtx(stream, &context), "cuStreamGetCtx (the stream given to read_async)");
  check(d.CtxSetCurrent(context), "cuCtxSetCurrent (the stream's context)");
}

// A stream being captured into a CUDA graph would record the host function and the wait as
// graph nodes, replayed with data the first replay frees and a flag already set: refused.
void refuse_capture(const Driver& d, abi::Stream stream) {
  abi::StreamCaptureStatus status = abi::kStreamCaptureStatusNone;
  check(d.StreamIsCapturing(stream, &status),
        "cuStreamIsCapturing (the stream given to read_async)");
  if (status != abi::kStreamCaptureStatusNone) {
    throw CudaError(
        "read_async/write_async on a stream that is capturing a CUDA graph: a stream-ordered "
        "request cannot be part of a graph (call it outside the capture)",
        0);
  }
}

}  // namespace

StreamOrder::StreamOrder(abi::Stream stream, int device) : stream_(stream), device_(device) {
  const Driver& d = driver();
  KeepContext keep(d);
  use_stream_context(d, stream, device);
  refuse_capture(d, stream);
  GateSlots::Slot slot = gates().acquire();
  flag_ = slot.host;
  flag_device_ = slot.device;
  value_ = slot.value;
  slot_ = slot.index;
}

StreamOrder::~StreamOrder() { release(); }

void StreamOrder::begin(std::function<void()> start) {
  if (at_once.load(std::memory_order_relaxed)) {
    start();
    return;
  }
  const Driver& d = driver();
  KeepContext keep(d);
  use_stream_context(d, stream_, device_);
  // Stream memory operations refused (by some GPUs and drivers) show here, before anything that
  // cannot be taken back is queued: a wait the flag already satisfies (it holds value_ - 1).
  abi::Result r = d.StreamWaitValue32(stream_, flag_device_, value_ - 1, abi::kStreamWaitValueGeq);
  if (r != abi::kSuccess) {
    throw CudaError(describe(r,
                             "cuStreamWaitValue32 (ordering the stream's later work after "
                             "the request; this GPU or driver refuses stream memory "
                             "operations)"),
                    static_cast<int>(r));
  }
  auto host = std::make_shared<HostStart>();
  host->start = std::move(start);
  auto* ref = new std::shared_ptr<HostStart>(host);
  r = d.LaunchHostFunc(stream_, &run_host_start, ref);
  if (r != abi::kSuccess) {
    delete ref;
    check(r, "cuLaunchHostFunc (starting the request after the stream's earlier work)");
  }
  host_queued.fetch_add(1, std::memory_order_relaxed);
  r = d.StreamWaitValue32(stream_, flag_device_, value_, abi::kStreamWaitValueGeq);
  if (r != abi::kSuccess) {
    int pending = HostStart::kPending;
    if (host->state.compare_exchange_strong(pending, HostStart::kAbandoned)) {
      check(r, "cuStreamWaitValue32 (ordering the stream's later work after the request)");
    }
    // The stream has started the request already (the same call succeeded a moment ago, so
    // this does not happen in practice): it runs, and the future completes as usual.
  }
}

void StreamOrder::release() noexcept {
  if (released_.exchange(true, std::memory_order_acq_rel)) return;
  // Every byte the request wrote (GPU copies completed, host stores) happens before the store the
  // GPU polls for.
  std::atomic_ref<std::uint32_t>(*flag_).store(value_, std::memory_order_seq_cst);
  gates().release(slot_);
}

std::size_t stream_gates_in_use() { return gates().in_use(); }

void testing::start_at_once(bool start) { at_once.store(start); }
std::uint64_t testing::host_functions_queued() { return host_queued.load(); }
std::uint64_t testing::host_functions_run() { return host_run.load(); }

}  // namespace ferry::cuda
