// Stream-ordered requests (File::read_async, File::write_async): the request's I/O runs on
// ferry's workers, after the work queued on the caller's stream before the call and before the
// work queued on it after, without blocking the caller or synchronising the stream.
//
// At the call, on the caller's thread: an event is recorded on the stream (the workers wait for
// it before they touch the buffer), and the stream is made to wait (cuStreamWaitValue32) for a
// flag in mapped pinned host memory. The request sets the flag once its last copy has completed,
// or once it failed or was cancelled (so that the stream never hangs; the error is the future's).
// The stream's later work then runs. The workers copy on non-blocking streams: a blocking one
// would wait for legacy-default-stream work queued after the call, which waits for the flag.
#pragma once

#include <atomic>
#include <cstdint>

#include "cuda/cuda_abi.h"

namespace ferry::cuda {

class StreamOrder {
 public:
  // Records the event and queues the wait on `stream` (0 is the legacy default stream) for a
  // request whose buffer is on `device` (-1: host memory); the caller's CUDA context is kept.
  // Throws CudaError (no driver, a bad stream, stream memory operations refused).
  StreamOrder(abi::Stream stream, int device);
  ~StreamOrder();  // releases the stream if release() was not called
  StreamOrder(const StreamOrder&) = delete;
  StreamOrder& operator=(const StreamOrder&) = delete;

  // Blocks until the work queued on the stream before the request has run; then returns at
  // once. Any thread. Throws CudaError.
  void wait_before() const;
  // Lets the stream's later work run. Call after the request's last byte is in place (or it
  // failed); idempotent.
  void release() noexcept;

  abi::Stream stream() const { return stream_; }

 private:
  abi::Stream stream_;
  abi::Context context_ = nullptr;  // the stream's
  abi::Event before_ = nullptr;
  std::uint32_t* flag_ = nullptr;  // host address of the gate's slot
  std::uint32_t value_ = 0;        // what the stream waits for the slot to reach
  std::size_t slot_ = 0;
  mutable std::atomic<bool> passed_{false};
  std::atomic<bool> released_{false};
};

// The gate slots in use (tests: every slot comes back once its request completes).
std::size_t stream_gates_in_use();

namespace testing {
// Tests only: wait_before() returns at once, so the workers no longer wait for the stream's
// earlier work (a test shows that its check then sees the order broken).
void skip_waits_before(bool skip);
}  // namespace testing

}  // namespace ferry::cuda
