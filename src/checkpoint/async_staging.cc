// The pinned staging pool of asynchronous saves (ferry/async_staging.h). The pool's memory is a
// list of pinned chunks laid out in the items' order: a save of the same tensors lands where the
// last one did, so after the first save nothing is allocated; a save that does not fit gets one
// chunk more, sized for the items left. Copies from a GPU run on one non-blocking stream of
// ferry's per device, ordered after the caller's stream by an event; every kBatchBytes an event
// is recorded, and the worker waits on them in turn, after copying the host items itself.
#include "ferry/async_staging.h"

#include <fmt/format.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "checkpoint/progress_meter.h"
#include "cuda/cuda_driver.h"
#include "ferry/error.h"
#include "ferry/memory.h"

namespace ferry {

namespace {

using Clock = std::chrono::steady_clock;
namespace abi = cuda::abi;
using checkpoint::seconds_since;

constexpr std::uint64_t kAlign = 4096;                         // O_DIRECT writes from the copies
constexpr std::uint64_t kBatchBytes = std::uint64_t{1} << 30;  // copies per event

std::uint64_t aligned(std::uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Puts the caller's CUDA context back when a scope ends.
class KeepContext {
 public:
  explicit KeepContext(const cuda::Driver* d) : d_(d) {
    if (d_ != nullptr) d_->CtxGetCurrent(&saved_);
  }
  ~KeepContext() {
    if (d_ != nullptr) d_->CtxSetCurrent(saved_);
  }
  KeepContext(const KeepContext&) = delete;
  KeepContext& operator=(const KeepContext&) = delete;

 private:
  const cuda::Driver* d_;
  abi::Context saved_ = nullptr;
};

struct Chunk {
  char* data = nullptr;
  std::uint64_t bytes = 0;
};

struct HostCopy {
  void* dst;
  const void* src;
  std::uint64_t bytes;
};

// The copies up to an event, and the tensors they hold (for errors).
struct Batch {
  int device;
  abi::Event event;
  std::string first, last;
};

// Each device's stream and events, made once and reused by every stage.
struct DeviceQueue {
  abi::Stream stream = nullptr;
  abi::Event after = nullptr;
  std::vector<abi::Event> events;
};

}  // namespace

// What the worker finishes of one stage. No reference to the pool: the worker never holds the
// last one.
struct AsyncStaging::Shared {
  std::vector<HostCopy> host;
  std::vector<Batch> batches;
  Clock::time_point start;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool done = false;
  std::string error;
  int code = 0;
};

struct AsyncStagingState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Chunk> chunks;
  bool pinned = true;
  std::map<int, DeviceQueue> devices;
  bool held = false;  // a AsyncStaging lives
  AsyncStagingReport report;
  std::deque<std::shared_ptr<AsyncStaging::Shared>> jobs;
  bool stop = false;
  std::thread worker;

  ~AsyncStagingState() {
    stop_worker();
    try {
      free_all();
    } catch (const Error&) {  // a driver gone at exit: the process's memory goes with it
    }
  }

  void stop_worker() {
    {
      std::lock_guard lock(mu);
      stop = true;
      cv.notify_all();
    }
    if (worker.joinable()) worker.join();
    stop = false;
  }

  void free_all() {
    const cuda::Driver* d = cuda::driver_or_null();
    KeepContext keep(d);
    for (const Chunk& c : chunks) {
      if (pinned && d != nullptr) {
        d->MemFreeHost(c.data);
      } else {
        std::free(c.data);
      }
    }
    chunks.clear();
    for (auto& [device, q] : devices) {
      if (d == nullptr) break;
      cuda::use_device(device);
      for (abi::Event e : q.events) d->EventDestroy(e);
      if (q.after != nullptr) d->EventDestroy(q.after);
      if (q.stream != nullptr) d->StreamDestroy(q.stream);
    }
    devices.clear();
    report.pinned_bytes = report.chunks = 0;
  }

  void run() {
    for (;;) {
      std::shared_ptr<AsyncStaging::Shared> job;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stop || !jobs.empty(); });
        if (jobs.empty()) return;
        job = jobs.front();
        jobs.pop_front();
      }
      finish(*job);
    }
  }

  void finish(AsyncStaging::Shared& job) {
    for (const HostCopy& c : job.host) std::memcpy(c.dst, c.src, c.bytes);
    std::string error;
    int code = 0;
    if (!job.batches.empty()) {
      const cuda::Driver& d = cuda::driver();
      for (const Batch& b : job.batches) {
        cuda::use_device(b.device);
        const abi::Result r = d.EventSynchronize(b.event);
        if (r != abi::kSuccess && error.empty()) {
          code = static_cast<int>(r);
          error = fmt::format("staging the copies of tensors '{}' to '{}' from cuda:{}: {}",
                              b.first, b.last, b.device, cuda::describe(r, "cuEventSynchronize"));
        }
      }
    }
    {
      std::lock_guard lock(mu);
      report.last_staged_seconds = seconds_since(job.start);
    }
    std::lock_guard lock(job.mu);
    job.error = std::move(error);
    job.code = code;
    job.done = true;
    job.cv.notify_all();
  }

  // The pool's memory for `items`, grown by one chunk where they do not fit. Under mu.
  std::vector<void*> lay_out(std::span<const StageItem> items) {
    std::vector<std::uint64_t> left(items.size() + 1, 0);  // bytes from item i on
    for (std::size_t i = items.size(); i-- > 0;) left[i] = left[i + 1] + aligned(items[i].nbytes);
    std::vector<void*> places(items.size(), nullptr);
    std::size_t chunk = 0;
    std::uint64_t cursor = 0;
    bool grew = false;
    for (std::size_t i = 0; i < items.size(); ++i) {
      const std::uint64_t need = aligned(items[i].nbytes);
      if (need == 0) continue;
      while (chunk < chunks.size() && cursor + need > chunks[chunk].bytes) {
        ++chunk;
        cursor = 0;
      }
      if (chunk == chunks.size()) {
        chunks.push_back(allocate(left[i]));
        grew = true;
      }
      places[i] = chunks[chunk].data + cursor;
      cursor += need;
    }
    if (grew) ++report.growths;
    return places;
  }

  Chunk allocate(std::uint64_t bytes) {
    const cuda::Driver* d = pinned ? cuda::driver_or_null() : nullptr;
    int gpus = 0;
    if (d != nullptr && (d->DeviceGetCount(&gpus) != abi::kSuccess || gpus == 0)) d = nullptr;
    void* p = nullptr;
    if (d != nullptr) {
      KeepContext keep(d);
      cuda::use_device(devices.empty() ? 0 : devices.begin()->first);
      const abi::Result r = d->MemHostAlloc(&p, bytes, abi::kMemHostAllocPortable);
      if (r != abi::kSuccess) {
        throw CudaError(cuda::describe(r, fmt::format("cuMemHostAlloc of {} B for the staging "
                                                      "pool ({} B pinned already)",
                                                      bytes, report.pinned_bytes)
                                              .c_str()),
                        static_cast<int>(r));
      }
    } else if (chunks.empty()) {
      // No driver or no GPU, so no GPU tensors either: pageable memory (reported).
      pinned = false;
    }
    if (p == nullptr) {
      p = std::aligned_alloc(kAlign, bytes);
      if (p == nullptr) {
        throw Error(fmt::format("async staging: allocating {} B of host memory failed", bytes));
      }
    }
    ++report.allocations;
    ++report.chunks;
    report.pinned_bytes += bytes;
    return Chunk{static_cast<char*>(p), bytes};
  }

  DeviceQueue& queue(const cuda::Driver& d, int device) {
    DeviceQueue& q = devices[device];
    if (q.stream == nullptr) {
      cuda::check(d.StreamCreate(&q.stream, abi::kStreamNonBlocking),
                  "cuStreamCreate (the async staging pool's copy stream)");
      cuda::check(d.EventCreate(&q.after, abi::kEventDisableTiming),
                  "cuEventCreate (the async staging pool's ordering event)");
    }
    return q;
  }
};

AsyncStaging::AsyncStaging(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

AsyncStaging::~AsyncStaging() {
  {
    std::unique_lock lock(shared_->mu);
    shared_->cv.wait(lock, [&] { return shared_->done; });
  }
  if (pool_ != nullptr) {
    std::lock_guard lock(pool_->mu);
    pool_->held = false;
    pool_->cv.notify_all();
  }
}

void AsyncStaging::wait() const {
  std::unique_lock lock(shared_->mu);
  shared_->cv.wait(lock, [&] { return shared_->done; });
  if (!shared_->error.empty()) throw CudaError(shared_->error, shared_->code);
}

bool AsyncStaging::done() const {
  std::lock_guard lock(shared_->mu);
  return shared_->done;
}

AsyncStagingPool::AsyncStagingPool() : state_(std::make_shared<AsyncStagingState>()) {}

AsyncStagingPool::~AsyncStagingPool() = default;  // the memory goes with the last AsyncStaging

std::shared_ptr<AsyncStaging> AsyncStagingPool::stage(std::span<const StageItem> items,
                                                      std::span<const StageAfter> after,
                                                      std::chrono::milliseconds wait_for_previous) {
  const Clock::time_point t0 = Clock::now();
  AsyncStagingState& s = *state_;
  std::unique_lock lock(s.mu);
  if (!s.cv.wait_for(lock, wait_for_previous, [&] { return !s.held; })) {
    throw Error(
        "async staging: the tensors of the previous stage are still in use (its save still "
        "writing them, or the staged state dict still referenced); wait for that save before "
        "staging the next one");
  }
  std::vector<void*> places = s.lay_out(items);
  auto shared = std::make_shared<AsyncStaging::Shared>();
  shared->start = t0;
  std::shared_ptr<AsyncStaging> staging(new AsyncStaging(shared));
  staging->places_ = std::move(places);
  staging->pool_ = state_;
  s.held = true;
  ++s.report.stages;
  s.report.last_bytes = s.report.last_gpu_bytes = s.report.last_batches = 0;

  const cuda::Driver* d = cuda::driver_for_queries();
  KeepContext keep(d);
  std::map<int, std::size_t> next_event;  // per device, the batch events used
  std::map<int, std::uint64_t> batch_bytes;
  std::map<int, std::size_t> open_batch;  // per device, the index of its open batch
  auto close_batch = [&](int device) {
    auto it = open_batch.find(device);
    if (it == open_batch.end()) return;
    Batch& b = shared->batches[it->second];
    DeviceQueue& q = s.devices[device];
    cuda::use_device(device);
    cuda::check(d->EventRecord(b.event, q.stream), "cuEventRecord (a staging batch)");
    open_batch.erase(it);
    batch_bytes[device] = 0;
  };
  try {
    for (std::size_t i = 0; i < items.size(); ++i) {
      const StageItem& item = items[i];
      s.report.last_bytes += item.nbytes;
      if (item.nbytes == 0) continue;
      const MemoryInfo m = classify_memory(item.data);
      if (!is_gpu(m.kind)) {
        shared->host.push_back({staging->places_[i], item.data, item.nbytes});
        continue;
      }
      const int device = m.device >= 0 ? m.device : 0;
      cuda::use_device(device);
      DeviceQueue& q = s.queue(*d, device);
      if (!next_event.contains(device)) {
        // The copies follow what the caller queued before the call.
        std::uintptr_t stream = 0;
        for (const StageAfter& a : after) {
          if (a.device == device) stream = a.stream;
        }
        cuda::check(d->EventRecord(q.after, reinterpret_cast<abi::Stream>(stream)),
                    "cuEventRecord (on the caller's stream, ordering the staging copies)");
        cuda::check(d->StreamWaitEvent(q.stream, q.after, 0),
                    "cuStreamWaitEvent (the staging copies after the caller's stream)");
        next_event[device] = 0;
      }
      if (!open_batch.contains(device)) {
        std::size_t& k = next_event[device];
        if (k == q.events.size()) {
          abi::Event e = nullptr;
          cuda::check(d->EventCreate(&e, abi::kEventDisableTiming),
                      "cuEventCreate (a staging batch)");
          q.events.push_back(e);
        }
        open_batch[device] = shared->batches.size();
        shared->batches.push_back({device, q.events[k++], item.name, item.name});
        ++s.report.last_batches;
      }
      const abi::Result r = d->MemcpyDtoHAsync(
          staging->places_[i], reinterpret_cast<abi::DevicePtr>(item.data), item.nbytes, q.stream);
      if (r != abi::kSuccess) {
        throw CudaError(fmt::format("staging tensor '{}' ({} B from cuda:{}): {}", item.name,
                                    item.nbytes, device, cuda::describe(r, "cuMemcpyDtoHAsync")),
                        static_cast<int>(r));
      }
      shared->batches[open_batch[device]].last = item.name;
      s.report.last_gpu_bytes += item.nbytes;
      if ((batch_bytes[device] += item.nbytes) >= kBatchBytes) close_batch(device);
    }
    while (!open_batch.empty()) close_batch(open_batch.begin()->first);
  } catch (...) {
    // What was queued writes into the pool: it runs before the pool is handed on.
    for (auto& [device, q] : s.devices) {
      try {
        cuda::use_device(device);
        if (q.stream != nullptr) d->StreamSynchronize(q.stream);
      } catch (const Error&) {  // the first error is the one to report
      }
    }
    shared->batches.clear();
    shared->host.clear();
    shared->done = true;
    lock.unlock();
    throw;  // `staging` goes, releasing the pool
  }
  if (!s.worker.joinable()) s.worker = std::thread([&s] { s.run(); });
  s.jobs.push_back(shared);
  s.report.last_queue_seconds = seconds_since(t0);
  s.cv.notify_all();
  return staging;
}

void AsyncStagingPool::close() {
  AsyncStagingState& s = *state_;
  {
    std::lock_guard lock(s.mu);
    if (s.held) {
      throw Error(
          "async staging: close() while the tensors of the last stage are still in use (their "
          "save still writing them, or the staged state dict still referenced)");
    }
  }
  s.stop_worker();
  std::lock_guard lock(s.mu);
  s.free_all();
}

AsyncStagingReport AsyncStagingPool::report() const {
  std::lock_guard lock(state_->mu);
  AsyncStagingReport r = state_->report;
  r.pinned = state_->pinned;
  return r;
}

}  // namespace ferry
