// Stream-ordered requests (File::read_async, File::write_async): the request's I/O runs on
// ferry's workers, after the work queued on the caller's stream before the call and before the
// work queued on it after, without blocking the caller or synchronising the stream. Two forms:
//
// StreamOrder, for host memory (no copy): at the call, a host function (cuLaunchHostFunc) that
// hands the request to the workers once the stream's earlier work has run, and a wait
// (cuStreamWaitValue32) for a flag in mapped pinned host memory, which the request sets once done,
// failed or cancelled (so that the stream never hangs; the error is the future's).
//
// StagedCopies, for GPU memory: pinned staging, with the copies queued on the caller's stream
// itself (below).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/cuda_abi.h"

namespace ferry::cuda {

class StreamOrder {
 public:
  // Takes a slot for the flag; queues nothing yet. `device`: the buffer's GPU (-1: host
  // memory), whose context is used when the caller has none current. Throws CudaError (no
  // driver, a bad stream).
  StreamOrder(abi::Stream stream, int device);
  ~StreamOrder();  // releases the stream if release() was not called
  StreamOrder(const StreamOrder&) = delete;
  StreamOrder& operator=(const StreamOrder&) = delete;

  // Queues on the stream the host function that calls `start` (in a CUDA thread, once the
  // earlier work has run; it must not call CUDA) and then the wait for the flag. The caller's
  // CUDA context is kept. Throws CudaError; `start` is then never called.
  void begin(std::function<void()> start);
  // Lets the stream's later work run. Call after the request's last byte is in place (or it
  // failed); idempotent.
  void release() noexcept;

  abi::Stream stream() const { return stream_; }

 private:
  abi::Stream stream_;
  int device_;
  std::uint32_t* flag_ = nullptr;  // host address of the gate's slot
  abi::DevicePtr flag_device_ = 0;
  std::uint32_t value_ = 0;  // what the stream waits for the slot to reach
  std::size_t slot_ = 0;
  std::atomic<bool> released_{false};
};

// A stream-ordered request on GPU memory. Its bytes pass through pinned staging of its own, and
// the copies between the staging and the buffer are queued on the caller's stream itself, at the
// call: a read queues, for each group of consecutive pieces (copy_groups), a wait for a flag and
// the group's copy into the buffer; a write queues the groups' copies out of the buffer; both then
// queue a host function (`done`). A request queues at most 2 * kMaxCopyGroups + 1 operations:
// CUDA blocks the caller that queues on a stream with about a thousand operations pending (on
// the H200, a stream held back by earlier work took 7 reads of 131 operations, one per task, and
// blocked the 8th), so per-task operations made a few queued reads block their caller.
//
// Staging in flight is bounded (kStagingInFlight; tests set a smaller bound: test_hooks.h): a
// request that would take more waits in its caller's thread until earlier stream-ordered requests
// complete (one alone always starts), as CUDA's own queue makes a caller wait who runs far ahead of
// the GPU. Without a bound a caller queueing N reads ahead pinned N requests' worth of host memory,
// all on the first run. The only waits on the stream are for flags that the CPU sets once a piece
// has been read into staging, which depends on no GPU work, so no wait ever depends on GPU work
// queued after it. (Copies on streams of ferry's, which the stream's later work waited for through
// a flag, deadlocked once a copy stream shared a hardware queue with the waiting stream: CUDA does
// not see an order set by cuStreamWaitValue32. tests/fake_cuda models that.) A read's workers start
// at the call, reading into the staging while the stream's earlier work runs; a write's start from
// `done`, once the copies have run. Thread-safe.
class StagedCopies {
 public:
  enum class Direction { kToDevice, kFromDevice };
  struct Piece {
    std::size_t offset;  // from the request's start, in the buffer and the staging alike
    std::size_t size;
  };
  struct CopyGroup {
    std::size_t offset;  // as Piece's
    std::size_t size;
    std::size_t end;  // the index of the first piece after the group
  };
  static constexpr std::size_t kMaxCopyGroups = 16;
  static constexpr std::size_t kMinCopyGroup = std::size_t{4} << 20;
  static constexpr std::size_t kStagingInFlight = std::size_t{256} << 20;

  // Consecutive pieces that are contiguous, grouped into copies of bytes / kMaxCopyGroups
  // (kMinCopyGroup at least) and at most one piece more: at most kMaxCopyGroups groups where the
  // pieces are contiguous.
  static std::vector<CopyGroup> copy_groups(const std::vector<Piece>& pieces, std::size_t bytes);

  // Takes the staging (pinned memory, reused; waits while kStagingInFlight is taken by other
  // requests) and, for a read, a gate slot; queues nothing. Throws CudaError.
  StagedCopies(abi::Stream stream, int device, Direction direction, abi::DevicePtr buffer,
               std::size_t bytes, std::vector<Piece> pieces);
  // Gives the staging and the slot back; makes no CUDA call (it may run in a host function).
  ~StagedCopies();
  StagedCopies(const StagedCopies&) = delete;
  StagedCopies& operator=(const StagedCopies&) = delete;

  char* staging() const { return staging_; }

  // Queues the copies and then `done`, which runs in a CUDA thread once they have run and must
  // not call CUDA. The staging stays alive until then. Throws CudaError, having released every
  // wait it queued; `done` is then never called.
  static void queue(const std::shared_ptr<StagedCopies>& self, std::function<void()> done);
  // A read: piece `index` is in the staging; the stream may copy every group whose pieces are
  // all staged, up to the first group that is not.
  void staged(std::size_t index) noexcept;
  // A read that failed or was cancelled: every wait passes (the copies then move whatever the
  // staging holds). Idempotent.
  void release_all() noexcept;
  // The `done` given to queue(), once (the host function's).
  std::function<void()> take_done();

 private:
  void set_flag(std::size_t groups) noexcept;
  void give_slot_back() noexcept;

  abi::Stream stream_;
  int device_;
  Direction direction_;
  abi::DevicePtr buffer_;
  std::vector<CopyGroup> groups_;
  char* staging_ = nullptr;
  std::size_t staging_bytes_ = 0;
  std::function<void()> done_;
  std::mutex mu_;
  std::vector<bool> landed_;
  std::size_t prefix_ = 0;       // pieces staged from the first on
  std::size_t groups_done_ = 0;  // groups wholly within that prefix
  std::uint32_t* flag_ = nullptr;
  abi::DevicePtr flag_device_ = 0;
  std::uint32_t first_value_ = 0;  // the value that lets group 0 be copied
  std::size_t slot_ = 0;
  bool slot_held_ = false;
};

// Pinned staging of stream-ordered GPU requests that no request holds: freed on request
// (KvikIO's bounce_buffer_free). Returns the bytes freed.
std::size_t free_idle_staged_copies();

// Host functions queued on streams by StreamOrder::begin(), and those the streams have run
// (diagnostics: a request that hangs shows whether its stream ever reached it).
std::uint64_t host_functions_queued();
std::uint64_t host_functions_run();

}  // namespace ferry::cuda
