#include "cuda/stream_order.h"

#include <algorithm>
#include <condition_variable>
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

  // Takes a slot for `uses` consecutive values: the stream waits for value + 1 - uses up to
  // `value`. A current CUDA context is needed to allocate the first page.
  Slot acquire(std::uint32_t uses = 1) {
    std::lock_guard lock(mu_);
    if (free_.empty()) grow();
    const std::size_t i = free_.back();
    free_.pop_back();
    ++in_use_;
    next_[i] += uses;
    return {i, host_[i], device_[i], next_[i]};
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

// Process-wide: every stream of the process queues host functions, whichever runtime asked.
std::atomic<std::uint64_t> host_queued{0};
std::atomic<std::uint64_t> host_run{0};

// Process-wide: a slot is polled by the GPU, whose streams any runtime's requests share.
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

namespace {

// Pinned, portable blocks for StagedCopies, kept for reuse once given back: a request takes the
// smallest idle block that holds it without wasting more than its own size, else a new one.
// give() makes no CUDA call (it runs in host functions); idle blocks beyond kKeepIdle are freed
// by the next take().
class PinnedCache {
 public:
  // Waits while blocks given out hold kStagingInFlight and this one would take more (one alone
  // is always given).
  char* take(std::size_t bytes, std::size_t* got) {
    std::vector<std::pair<char*, std::size_t>> surplus;
    {
      std::unique_lock lock(mu_);
      given_back_.wait(lock, [&] { return in_use_ == 0 || in_use_ + bytes <= bound_; });
      auto best = idle_.end();
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (it->second >= bytes && it->second <= 2 * bytes + kGrain &&
            (best == idle_.end() || it->second < best->second)) {
          best = it;
        }
      }
      if (best != idle_.end()) {
        char* p = best->first;
        *got = best->second;
        idle_bytes_ -= best->second;
        in_use_ += best->second;
        idle_.erase(best);
        return p;
      }
      while (idle_bytes_ > kKeepIdle && !idle_.empty()) {
        surplus.push_back(idle_.back());
        idle_bytes_ -= idle_.back().second;
        idle_.pop_back();
      }
      const std::size_t size = (bytes + kGrain - 1) / kGrain * kGrain;
      in_use_ += size;  // counted from now, so that callers beside this one wait for it
      *got = size;
    }
    const Driver& d = driver();
    for (auto& [p, n] : surplus) d.MemFreeHost(p);
    void* p = nullptr;
    abi::Result r = d.MemHostAlloc(&p, *got, abi::kMemHostAllocPortable);
    if (r != abi::kSuccess) {
      {
        std::lock_guard lock(mu_);
        in_use_ -= *got;
      }
      given_back_.notify_all();
      check(r, "cuMemHostAlloc (staging of a stream-ordered request)");
    }
    return static_cast<char*>(p);
  }

  void give(char* p, std::size_t bytes) noexcept {
    {
      std::lock_guard lock(mu_);
      idle_.emplace_back(p, bytes);
      idle_bytes_ += bytes;
      in_use_ -= bytes;
    }
    given_back_.notify_all();
  }

  std::size_t in_use() {
    std::lock_guard lock(mu_);
    return in_use_;
  }

  void set_bound(std::size_t bytes) {
    {
      std::lock_guard lock(mu_);
      bound_ = bytes;
    }
    given_back_.notify_all();
  }

  std::size_t free_idle() {
    std::vector<std::pair<char*, std::size_t>> blocks;
    {
      std::lock_guard lock(mu_);
      blocks.swap(idle_);
      idle_bytes_ = 0;
    }
    std::size_t freed = 0;
    if (blocks.empty()) return 0;
    const Driver& d = driver();
    for (auto& [p, n] : blocks) {
      d.MemFreeHost(p);
      freed += n;
    }
    return freed;
  }

 private:
  static constexpr std::size_t kGrain = std::size_t{2} << 20;
  static constexpr std::size_t kKeepIdle = std::size_t{1} << 30;
  std::mutex mu_;
  std::condition_variable given_back_;
  std::vector<std::pair<char*, std::size_t>> idle_;
  std::size_t idle_bytes_ = 0;
  std::size_t in_use_ = 0;  // given out, not yet back
  std::size_t bound_ = StagedCopies::kStagingInFlight;
};

// Process-wide: stream-ordered requests of every runtime share one bound on pinned staging.
PinnedCache& pinned_cache() {
  static auto* c = new PinnedCache;  // leaked: host functions may give blocks back at exit
  return *c;
}

void run_staged_done(void* data) {
  host_run.fetch_add(1, std::memory_order_relaxed);
  std::unique_ptr<std::shared_ptr<StagedCopies>> ref(
      static_cast<std::shared_ptr<StagedCopies>*>(data));
  std::function<void()> done = (*ref)->take_done();
  if (done) done();
}

}  // namespace

std::vector<StagedCopies::CopyGroup> StagedCopies::copy_groups(const std::vector<Piece>& pieces,
                                                               std::size_t bytes) {
  const std::size_t target = std::max(kMinCopyGroup, (bytes + kMaxCopyGroups - 1) / kMaxCopyGroups);
  std::vector<CopyGroup> groups;
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const Piece& p = pieces[k];
    if (!groups.empty()) {
      CopyGroup& g = groups.back();
      // A group takes pieces until it holds `target` bytes: every group but the last holds
      // bytes / kMaxCopyGroups at least, so there are at most kMaxCopyGroups of them.
      if (g.offset + g.size == p.offset && g.size < target) {
        g.size += p.size;
        g.end = k + 1;
        continue;
      }
    }
    groups.push_back({p.offset, p.size, k + 1});
  }
  return groups;
}

StagedCopies::StagedCopies(abi::Stream stream, int device, Direction direction,
                           abi::DevicePtr buffer, std::size_t bytes, std::vector<Piece> pieces)
    : stream_(stream),
      device_(device),
      direction_(direction),
      buffer_(buffer),
      groups_(copy_groups(pieces, bytes)),
      landed_(pieces.size(), false) {
  const Driver& d = driver();
  KeepContext keep(d);
  use_stream_context(d, stream, device);
  refuse_capture(d, stream);
  staging_ = pinned_cache().take(std::max<std::size_t>(bytes, 1), &staging_bytes_);
  if (direction_ == Direction::kToDevice && !groups_.empty()) {
    GateSlots::Slot slot = gates().acquire(static_cast<std::uint32_t>(groups_.size()));
    flag_ = slot.host;
    flag_device_ = slot.device;
    first_value_ = slot.value - static_cast<std::uint32_t>(groups_.size()) + 1;
    slot_ = slot.index;
    slot_held_ = true;
  }
}

StagedCopies::~StagedCopies() {
  release_all();
  pinned_cache().give(staging_, staging_bytes_);
}

std::function<void()> StagedCopies::take_done() {
  std::lock_guard lock(mu_);
  return std::move(done_);
}

void StagedCopies::queue(const std::shared_ptr<StagedCopies>& self, std::function<void()> done) {
  StagedCopies& c = *self;
  const Driver& d = driver();
  KeepContext keep(d);
  use_stream_context(d, c.stream_, c.device_);
  bool queued_any = false;
  auto fail = [&](abi::Result r, const char* what) {
    c.release_all();
    // What was queued still reads or writes the staging: it stays until the stream has passed
    // it, or for good where not even that can be queued.
    if (queued_any) {
      auto* keep_alive = new std::shared_ptr<StagedCopies>(self);
      if (d.LaunchHostFunc(c.stream_, &run_staged_done, keep_alive) != abi::kSuccess) {
        (void)keep_alive;  // leaked on purpose: the stream may still use the staging
      }
    }
    throw CudaError(describe(r, what), static_cast<int>(r));
  };
  for (std::size_t k = 0; k < c.groups_.size(); ++k) {
    const CopyGroup& g = c.groups_[k];
    if (c.direction_ == Direction::kToDevice) {
      abi::Result r = d.StreamWaitValue32(c.stream_, c.flag_device_,
                                          c.first_value_ + static_cast<std::uint32_t>(k),
                                          abi::kStreamWaitValueGeq);
      if (r != abi::kSuccess) {
        fail(r, k == 0 ? "cuStreamWaitValue32 (a stream-ordered read waits on the stream for "
                         "its pieces to be staged; this GPU or driver refuses stream memory "
                         "operations)"
                       : "cuStreamWaitValue32 (a stream-ordered read's copy)");
      }
      queued_any = true;
      r = d.MemcpyHtoDAsync(c.buffer_ + g.offset, c.staging_ + g.offset, g.size, c.stream_);
      if (r != abi::kSuccess) fail(r, "cuMemcpyHtoDAsync (a stream-ordered read's copy)");
    } else {
      abi::Result r =
          d.MemcpyDtoHAsync(c.staging_ + g.offset, c.buffer_ + g.offset, g.size, c.stream_);
      if (r != abi::kSuccess) fail(r, "cuMemcpyDtoHAsync (a stream-ordered write's copy)");
      queued_any = true;
    }
  }
  {
    std::lock_guard lock(c.mu_);
    c.done_ = std::move(done);
  }
  auto* ref = new std::shared_ptr<StagedCopies>(self);
  abi::Result r = d.LaunchHostFunc(c.stream_, &run_staged_done, ref);
  if (r != abi::kSuccess) {
    delete ref;
    c.take_done();  // never called
    fail(r, "cuLaunchHostFunc (completing a stream-ordered request after its copies)");
  }
  host_queued.fetch_add(1, std::memory_order_relaxed);
}

void StagedCopies::staged(std::size_t index) noexcept {
  std::lock_guard lock(mu_);
  if (!slot_held_ || index >= landed_.size()) return;
  landed_[index] = true;
  while (prefix_ < landed_.size() && landed_[prefix_]) ++prefix_;
  const std::size_t before = groups_done_;
  while (groups_done_ < groups_.size() && groups_[groups_done_].end <= prefix_) ++groups_done_;
  if (groups_done_ != before) set_flag(groups_done_);
  if (groups_done_ == groups_.size()) give_slot_back();
}

void StagedCopies::release_all() noexcept {
  std::lock_guard lock(mu_);
  if (!slot_held_) return;
  prefix_ = landed_.size();
  groups_done_ = groups_.size();
  set_flag(groups_done_);
  give_slot_back();
}

void StagedCopies::set_flag(std::size_t groups) noexcept {
  // The pieces' bytes (the workers' preads) happen before the store the GPU polls for.
  std::atomic_ref<std::uint32_t>(*flag_).store(
      first_value_ - 1 + static_cast<std::uint32_t>(groups), std::memory_order_seq_cst);
}

void StagedCopies::give_slot_back() noexcept {
  slot_held_ = false;
  gates().release(slot_);
}

std::size_t free_idle_staged_copies() { return pinned_cache().free_idle(); }

// For tests only: declared in tests/test_hooks.h.
std::size_t stream_gates_in_use() { return gates().in_use(); }

std::size_t staging_in_flight() { return pinned_cache().in_use(); }

void set_staging_in_flight_bound(std::size_t bytes) { pinned_cache().set_bound(bytes); }

std::uint64_t host_functions_queued() { return host_queued.load(); }
std::uint64_t host_functions_run() { return host_run.load(); }

}  // namespace ferry::cuda
