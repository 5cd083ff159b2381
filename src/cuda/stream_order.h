// Stream-ordered requests (File::read_async, File::write_async): the request's I/O runs on
// ferry's workers, after the work queued on the caller's stream before the call and before the
// work queued on it after, without blocking the caller or synchronising the stream.
//
// At the call, on the caller's thread, two things are queued on the stream: a host function
// (cuLaunchHostFunc) that hands the request to the workers once the stream's earlier work has
// run, and a wait (cuStreamWaitValue32) for a flag in mapped pinned host memory, which the
// request sets once its last copy has completed, or once it failed or was cancelled (so that
// the stream never hangs; the error is the future's). The stream's later work then runs.
//
// The workers never wait for the GPU's work: they start only when it is done, so no worker
// thread is held while a kernel runs, and a request never waits for one queued behind it. They
// copy on non-blocking streams: a blocking one would wait for legacy-default-stream work queued
// after the call, which waits for the flag.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

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

// The gate slots in use (tests: every slot comes back once its request completes).
std::size_t stream_gates_in_use();

namespace testing {
// Tests only: begin() calls `start` at once instead of from the stream, so requests no longer
// wait for the stream's earlier work (a test shows that its check then sees the order broken).
void start_at_once(bool at_once);
// Host functions queued on streams by begin(), and those the streams have run (diagnostics).
std::uint64_t host_functions_queued();
std::uint64_t host_functions_run();
}  // namespace testing

}  // namespace ferry::cuda
