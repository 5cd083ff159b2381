#include "posix/posix_backend.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/runtime_state.h"
#include "cuda/cuda_driver.h"
#include "ferry/error.h"
#include "io/numa_staging.h"
#include "io/page_cache.h"
#include "io/staging_pool.h"

namespace ferry::posix {
namespace {

using io::kAlignment;
using io::kPipelineDepth;

std::uint64_t align_down(std::uint64_t x) { return x / kAlignment * kAlignment; }
std::uint64_t align_up(std::uint64_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; }
std::size_t bounce_size(const Settings& s) { return align_up(s.bounce_buffer_size); }

// EAGAIN from a regular file means a file system (NFS, FUSE) that cannot serve the call now:
// retry, waiting longer each time (up to 1 ms), and give up after about 2 s with the error.
class Backoff {
 public:
  bool wait() {
    if (++tries_ > kTries) return false;
    std::this_thread::sleep_for(
        std::chrono::microseconds(std::min(1000, 1 << std::min(tries_, 10))));
    return true;
  }

 private:
  static constexpr int kTries = 2000;
  int tries_ = 0;
};

// Reads until `len` bytes or end of file; returns the count. A buffered read of 0 bytes is the
// end of the file. A short O_DIRECT read is the end of the file only where the file's size says
// so: NFS and FUSE may return short counts before it. Then the read goes on where the count is
// block-aligned, and fails where it is not (an O_DIRECT read cannot start mid-block): never a
// silent truncation. `moved`: the bytes its task moved before, which an error reports.
std::size_t read_range(io::IoSeam& io, const std::string& path, int fd, char* buf, std::size_t len,
                       std::uint64_t off, bool direct, std::size_t moved) {
  std::size_t done = 0;
  Backoff again;
  while (done < len) {
    ssize_t n = io.pread(fd, buf + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR || (errno == EAGAIN && again.wait())) continue;
      throw IoError(errno, direct ? "pread(O_DIRECT)" : "pread", path, off + done, len - done,
                    moved);
    }
    done += static_cast<std::size_t>(n);
    // Buffered, 0 is the end of the file whatever fstat said: sysfs attributes report 4096 B
    // and end sooner (issue 30, finding 15), a file cut short mid-read ends at the cut.
    if (n == 0 && !direct) break;
    if (n == 0 || (direct && done < len)) {
      struct stat st {};
      if (io.fstat(fd, &st) != 0) throw IoError(errno, "fstat", path, off + done, 0);
      const auto file_size = static_cast<std::uint64_t>(st.st_size);
      if (off + done >= file_size) break;  // the end of the file
      if (n > 0 && (!direct || (off + done) % kAlignment == 0)) continue;
      throw IoError(EIO, direct ? "pread(O_DIRECT)" : "pread", path, off + done, len - done, moved,
                    fmt::format("short read of {} B before the end of the file ({} B): not an "
                                "end of file, and O_DIRECT cannot resume mid-block",
                                n, file_size));
    }
  }
  return done;
}

class PosixWorker final : public core::Worker {
 public:
  explicit PosixWorker(const core::RequestContext& c)
      : c_(c),
        io_(c.file.io()),
        gpu_(is_gpu(c.memory.kind)),
        fd_(c.file.fd()),
        dfd_(c.file.direct_fd()),
        write_behind_(c.op == Op::kWrite && c.file.write_behind()) {
    if (gpu_) {
      cuda::use_device(c.memory.device);
      stager_ = c.file.runtime().staging().acquire(c.memory.device, bounce_size(c.settings));
      stream_ = stager_->stream;
    } else if (dfd_ >= 0) {
      stager_ = c.file.runtime().staging().acquire(-1, bounce_size(c.settings));
    }
    may_go_cold_ = c.op == Op::kRead && dfd_ < 0;
  }

  ~PosixWorker() override {
    // Copies may still read from the staging buffers after a failure: drain them before the
    // stager goes back to the pool.
    if (stream_ != nullptr) cuda::driver().StreamSynchronize(stream_);
  }

  std::size_t run(const core::Task& task) override {
    const io::CancelScope cancel(&c_.cancelled);  // a remote GET or retry wait stops with it
    moved_ = 0;
    if (c_.op == Op::kRead) {
      read_task(task);
    } else {
      write_task(task, nullptr);
    }
    return moved_;
  }

  // Buffered writes from GPU memory: the copy of the next task's first chunk overlaps this
  // task's last write, so that one writer has no copy on its critical path between tasks
  // (bench/NOTES.md §4).
  bool looks_ahead() const override { return gpu_ && c_.op == Op::kWrite && dfd_ < 0; }
  std::size_t run_then(const core::Task& task, const core::Task& next) override {
    const io::CancelScope cancel(&c_.cancelled);
    moved_ = 0;
    write_task(task, &next);
    return moved_;
  }

  void finish() override {
    end_run();
    if (stream_ != nullptr) {
      cuda::check(cuda::driver().StreamSynchronize(stream_),
                  "cuStreamSynchronize (copies from staging buffers)");
      std::fill(stager_->pending.begin(), stager_->pending.end(), false);
    }
  }

 private:
  char* target(const core::Task& task, std::uint64_t file_offset) const {
    return c_.buffer + task.buffer_offset + (file_offset - task.file_offset);
  }

  std::size_t read_full(int fd, char* buf, std::size_t len, std::uint64_t off, bool direct) {
    return read_range(io_, c_.file.path(), fd, buf, len, off, direct, moved_);
  }

  void write_full(int fd, const char* buf, std::size_t len, std::uint64_t off) {
    std::size_t done = 0;
    Backoff again;
    while (done < len) {
      ssize_t n = io_.pwrite(fd, buf + done, len - done, static_cast<off_t>(off + done));
      if (n < 0) {
        if (errno == EINTR || (errno == EAGAIN && again.wait())) continue;
        throw IoError(errno, dfd_ >= 0 && fd == dfd_ ? "pwrite(O_DIRECT)" : "pwrite",
                      c_.file.path(), off + done, len - done, moved_ + done);
      }
      if (n == 0) {
        throw IoError(EIO, "pwrite", c_.file.path(), off + done, len - done, moved_ + done,
                      "pwrite wrote nothing");
      }
      done += static_cast<std::size_t>(n);
    }
    moved_ += len;
    // Write-behind: these pages start on their way to the disk now, without waiting; a failure
    // to start (a file system without it) leaves them to the fsync, which reports any error.
    if (write_behind_ && fd == fd_) {
      io_.sync_file_range(fd, static_cast<off_t>(off), static_cast<off_t>(len),
                          SYNC_FILE_RANGE_WRITE);
    }
  }

  // The next staging slot, once the copy that last used it has completed.
  std::size_t next_slot() {
    std::size_t i = stager_->next;
    stager_->next = (i + 1) % stager_->slots.size();
    if (stager_->pending[i]) {
      cuda::check(cuda::driver().EventSynchronize(stager_->events[i]),
                  "cuEventSynchronize (copy from staging buffer)");
      stager_->pending[i] = false;
    }
    return i;
  }

  // The descriptor for a buffered File's cold task: O_DIRECT when the task's pages are not
  // cached (-1 keeps the buffered one).
  int cold_fd(const core::Task& task) {
    if (!may_go_cold_ || c_.residency == nullptr ||
        !reads_cold(*c_.file.runtime().env().host, *c_.residency, fd_, task.file_offset, task.size))
      return -1;
    int fd = c_.file.cold_direct_fd();
    if (fd < 0) {
      may_go_cold_ = false;  // the file system refuses O_DIRECT: stay buffered, and say so
      c_.cold_refused.store(true, std::memory_order_relaxed);
      return -1;
    }
    if (!gpu_ && !stager_)
      stager_ = c_.file.runtime().staging().acquire(-1, bounce_size(c_.settings));
    return fd;
  }

  // Small buffered tasks into GPU memory share a staging slot, one after the other, and tasks
  // whose bytes follow each other in the buffer share one copy: a gathered read of 4 KiB rows
  // into one buffer makes one cuMemcpyHtoDAsync per run of rows instead of one per row, which
  // measured 637 k rows/s on the GPU machine, bound by the copies (bench/NOTES.md §18).
  static constexpr std::size_t kSharedSlotTask = std::size_t{64} << 10;

  // Issues the copy of the run gathered so far.
  void flush_copy() {
    if (run_len_ == 0) return;
    cuda::check(cuda::driver().MemcpyHtoDAsync(reinterpret_cast<cuda::abi::DevicePtr>(run_dst_),
                                               run_src_, run_len_, stream_),
                "cuMemcpyHtoDAsync");
    run_len_ = 0;
  }

  // Issues the pending copy and lets the shared slot go: its event completes once the copies
  // from it have.
  void end_run() {
    if (shared_slot_ == SIZE_MAX) return;
    flush_copy();
    cuda::check(cuda::driver().EventRecord(stager_->events[shared_slot_], stream_),
                "cuEventRecord");
    stager_->pending[shared_slot_] = true;
    shared_slot_ = SIZE_MAX;
  }

  void read_small_task(const core::Task& task) {
    if (shared_slot_ == SIZE_MAX || shared_fill_ + task.size > stager_->size) {
      end_run();
      shared_slot_ = next_slot();
      shared_fill_ = 0;
    }
    char* at = stager_->slots[shared_slot_] + shared_fill_;
    const std::size_t n = read_full(fd_, at, task.size, task.file_offset, false);
    if (n == 0) return;
    char* dst = target(task, task.file_offset);
    // Only within one of the caller's buffers: the next range's buffer may be another CUDA
    // allocation that happens to follow this one in address space, and a copy spanning two
    // fails with CUDA_ERROR_INVALID_VALUE (on the H200, `ferry load --gpu` of every
    // transformers-saved checkpoint did: its small tensors are adjacent allocations; issue 29).
    if (run_len_ > 0 && run_range_ == task.range && run_dst_ + run_len_ == dst &&
        run_src_ + run_len_ == at) {
      run_len_ += n;
    } else {
      flush_copy();
      run_dst_ = dst;
      run_src_ = at;
      run_len_ = n;
      run_range_ = task.range;
    }
    shared_fill_ += n;
    moved_ = n;
  }

  void read_task(const core::Task& task) {
    const std::uint64_t begin = task.file_offset;
    const std::uint64_t end = begin + task.size;
    // Tasks this small are never read with O_DIRECT for coldness (kColdTaskMin).
    static_assert(kSharedSlotTask < kColdTaskMin);
    if (gpu_ && dfd_ < 0 && task.size <= kSharedSlotTask && task.size <= stager_->size / 2) {
      read_small_task(task);
      return;
    }
    end_run();  // the slots go round in order
    const int cold = cold_fd(task);
    if (cold >= 0) c_.direct_tasks.fetch_add(1, std::memory_order_relaxed);
    const bool direct = dfd_ >= 0 || cold >= 0;
    const int fd = cold >= 0 ? cold : direct ? dfd_ : fd_;
    char* dst = target(task, begin);
    if (!gpu_ && (!direct || (reinterpret_cast<std::uintptr_t>(dst) % kAlignment == 0 &&
                              begin % kAlignment == 0 && task.size % kAlignment == 0))) {
      moved_ = read_full(fd, dst, task.size, begin, direct);
      return;
    }
    // Through the staging buffers: for O_DIRECT the aligned cover of [begin, end).
    std::uint64_t pos = direct ? align_down(begin) : begin;
    const std::uint64_t stop = direct ? align_up(end) : end;
    while (pos < stop && !c_.cancelled.load(std::memory_order_relaxed)) {
      const std::size_t len = std::min<std::uint64_t>(stager_->size, stop - pos);
      const std::size_t slot = gpu_ ? next_slot() : 0;
      char* staged = stager_->slots[slot];
      const std::size_t n = read_full(fd, staged, len, pos, direct);
      const std::uint64_t use_begin = std::max(pos, begin);
      const std::uint64_t use_end = std::min(pos + n, end);
      if (use_end > use_begin) {
        const std::size_t use = use_end - use_begin;
        if (gpu_) {
          const cuda::Driver& d = cuda::driver();
          cuda::check(
              d.MemcpyHtoDAsync(reinterpret_cast<cuda::abi::DevicePtr>(target(task, use_begin)),
                                staged + (use_begin - pos), use, stream_),
              "cuMemcpyHtoDAsync");
          cuda::check(d.EventRecord(stager_->events[slot], stream_), "cuEventRecord");
          stager_->pending[slot] = true;
        } else {
          std::memcpy(target(task, use_begin), staged + (use_begin - pos), use);
        }
        moved_ += use;
      }
      if (n < len) break;  // end of file
      pos += len;
    }
  }

  // Writes [off, off+len) of the task from the caller's buffer through `fd`, staging through
  // the staging buffers when the source is GPU memory or O_DIRECT needs an aligned source.
  void write_segment(const core::Task& task, int fd, std::uint64_t off, std::size_t len) {
    const char* src = target(task, off);
    const bool aligned_src = reinterpret_cast<std::uintptr_t>(src) % kAlignment == 0;
    if (!gpu_ && (dfd_ < 0 || fd != dfd_ || aligned_src)) {
      write_full(fd, src, len, off);
      return;
    }
    if (gpu_) {
      write_from_gpu(fd, src, len, off, nullptr);
      return;
    }
    std::size_t done = 0;
    while (done < len && !c_.cancelled.load(std::memory_order_relaxed)) {
      const std::size_t n = std::min(stager_->size, len - done);
      char* staged = stager_->slots[0];
      std::memcpy(staged, src + done, n);
      write_full(fd, staged, n, off + done);
      done += n;
    }
  }

  // A write from GPU memory, double-buffered: the copy of chunk j + 1 into one staging slot runs
  // while chunk j is written from the other, so that one writer keeps the GPU copy off its
  // critical path (bench/NOTES.md §4). A chunk that nothing overlaps (a segment's first, unless
  // it was copied ahead) is a quarter of the segment (at least 1 MiB, at most a slot, whole
  // O_DIRECT blocks), so a task of one slot's size overlaps too. Given the segment written next
  // (`then`, a buffered write's next task; its `len` is 0 at the end), its first chunk's copy
  // overlaps this segment's last write, that segment starts from it, and the chunks after the
  // first are whole slots: each one's copy overlaps a write all the same, at a quarter of the
  // copies, event waits and pwrite calls. The chunks are written in order: a failure leaves the
  // prefix written, as moved_ says.
  struct Segment {
    const char* src;
    std::size_t len;
  };
  std::size_t gpu_chunk(std::size_t len) const {
    constexpr std::size_t kMinChunk = std::size_t{1} << 20;
    std::size_t chunk = std::min(stager_->size, std::max(kMinChunk, (len + 3) / 4));
    if (chunk > kAlignment) chunk = chunk / kAlignment * kAlignment;
    return chunk;
  }
  std::size_t copy_from_gpu(const char* src, std::size_t n) {
    const cuda::Driver& d = cuda::driver();
    const std::size_t slot = next_slot();
    cuda::check(d.MemcpyDtoHAsync(stager_->slots[slot], reinterpret_cast<cuda::abi::DevicePtr>(src),
                                  n, stream_),
                "cuMemcpyDtoHAsync");
    cuda::check(d.EventRecord(stager_->events[slot], stream_), "cuEventRecord");
    stager_->pending[slot] = true;
    return slot;
  }
  void write_from_gpu(int fd, const char* src, std::size_t len, std::uint64_t off,
                      const Segment* then) {
    const std::size_t chunk = then != nullptr ? stager_->size : gpu_chunk(len);
    const bool ahead = prefetched_.slot != SIZE_MAX && prefetched_.src == src &&
                       prefetched_.len == std::min(chunk, len);
    std::size_t n = ahead ? prefetched_.len : std::min(gpu_chunk(len), len);
    std::size_t slot = ahead ? prefetched_.slot : copy_from_gpu(src, n);
    prefetched_ = {};
    for (std::size_t at = 0; at < len && !c_.cancelled.load(std::memory_order_relaxed);) {
      const std::size_t after = std::min(chunk, len - at - n);
      std::size_t next = SIZE_MAX;
      if (after > 0) {
        next = copy_from_gpu(src + at + n, after);
      } else if (then != nullptr && then->len > 0) {
        const std::size_t then_first = std::min(chunk, then->len);
        prefetched_ = {then->src, then_first, copy_from_gpu(then->src, then_first)};
      }
      cuda::check(cuda::driver().EventSynchronize(stager_->events[slot]),
                  "cuEventSynchronize (copy into a staging buffer)");
      stager_->pending[slot] = false;
      write_full(fd, stager_->slots[slot], n, off + at);
      at += n;
      slot = next;
      n = after;
    }
  }

  void write_task(const core::Task& task, const core::Task* next) {
    const std::uint64_t begin = task.file_offset;
    const std::uint64_t end = begin + task.size;
    if (dfd_ < 0) {
      if (gpu_) {
        const Segment then{next != nullptr ? target(*next, next->file_offset) : nullptr,
                           next != nullptr ? next->size : 0};
        write_from_gpu(fd_, target(task, begin), task.size, begin, &then);
        return;
      }
      write_segment(task, fd_, begin, task.size);
      return;
    }
    // O_DIRECT for the aligned middle; the unaligned head and tail through the buffered
    // descriptor, since O_DIRECT cannot write part of a block.
    const std::uint64_t mid_begin = std::min(align_up(begin), end);
    const std::uint64_t mid_end = std::max(align_down(end), mid_begin);
    if (mid_begin > begin) write_segment(task, fd_, begin, mid_begin - begin);
    if (mid_end > mid_begin) write_segment(task, dfd_, mid_begin, mid_end - mid_begin);
    if (end > mid_end) write_segment(task, fd_, mid_end, end - mid_end);
  }

  const core::RequestContext& c_;
  io::IoSeam& io_;
  const bool gpu_;
  const int fd_;
  const int dfd_;
  const bool write_behind_;
  io::StagingPool::Handle stager_{nullptr, io::StagingPool::Release{nullptr}};
  cuda::abi::Stream stream_ = nullptr;  // the stager's copy stream for this request (GPU only)
  // Small tasks (read_small_task): the slot they share and how much of it is used, and the run
  // of bytes, adjacent both in the slot and in the buffer, that one copy will move.
  std::size_t shared_slot_ = SIZE_MAX;
  std::size_t shared_fill_ = 0;
  char* run_dst_ = nullptr;
  const char* run_src_ = nullptr;
  std::size_t run_len_ = 0;
  std::size_t run_range_ = 0;  // the caller's range (Task::range) the run's bytes belong to
  std::size_t moved_ = 0;
  // A buffered write's next first chunk, copied into `slot` during the last write (run_then).
  struct Prefetched {
    const char* src = nullptr;
    std::size_t len = 0;
    std::size_t slot = SIZE_MAX;
  };
  Prefetched prefetched_;
  bool may_go_cold_ = false;  // a buffered read, on a file system that takes O_DIRECT
};

}  // namespace

bool reads_cold(const core::HostPath& host, const PageCacheResidency& whole, int fd,
                std::uint64_t offset, std::size_t size) {
  if (size < kColdTaskMin || !whole.known || whole.resident >= whole.bytes) return false;
  if (whole.resident == 0 && !whole.estimated) return true;
  PageCacheResidency task = host.residency(fd, offset, size);
  return task.known && task.fraction() < kColdTaskResident;
}

std::string preallocate_for_write(core::OpenFile& file, std::uint64_t offset, std::uint64_t size) {
  constexpr long kExt4SuperMagic = 0xEF53;  // EXT4_SUPER_MAGIC in linux/magic.h
  if (size < kPreallocateMin || file.direct_fd() >= 0) return {};
  struct statfs fs {};
  if (::fstatfs(file.fd(), &fs) != 0 || fs.f_type != kExt4SuperMagic) return {};
  struct stat st {};
  if (file.io().fstat(file.fd(), &st) != 0 || !S_ISREG(st.st_mode)) return {};
  const std::uint64_t begin =
      std::max<std::uint64_t>(offset, static_cast<std::uint64_t>(st.st_size));
  const std::uint64_t end = offset + size;
  if (end <= begin || end - begin < kPreallocateMin) return {};
  if (file.io().fallocate(file.fd(), FALLOC_FL_KEEP_SIZE, static_cast<off_t>(begin),
                          static_cast<off_t>(end - begin)) != 0) {
    return fmt::format("blocks for the {} beyond the file's end not allocated ahead: fallocate: {}",
                       format_size(end - begin), std::strerror(errno));
  }
  return fmt::format(
      "the {} beyond the file's end allocated ahead of the writes (fallocate, keeping the "
      "size): ext4 then writes into allocated blocks, at less CPU than delayed allocation",
      format_size(end - begin));
}

std::unique_ptr<core::Worker> PosixBackend::make_worker(const core::RequestContext& context) {
  return std::make_unique<PosixWorker>(context);
}

std::size_t PosixBackend::run_inline(const core::RequestContext& context,
                                     const core::Task& task) const {
  // A read into host memory on a buffered descriptor, too small to be read cold: the one pread,
  // without a worker (its making and finishing were 120 of a small request's instructions,
  // bench/NOTES.md).
  const core::OpenFile& file = context.file;
  if (context.op == Op::kRead && !is_gpu(context.memory.kind) && file.direct_fd() < 0 &&
      task.size < kColdTaskMin) {
    const io::CancelScope cancel(&context.cancelled);
    return read_range(file.io(), file.path(), file.fd(), context.buffer + task.buffer_offset,
                      task.size, task.file_offset, false, 0);
  }
  PosixWorker worker(context);
  std::size_t n = worker.run(task);
  worker.finish();
  return n;
}

// Buffered writes to one file serialise on the inode's lock in the kernel (ext4 and xfs take it
// exclusively for each buffered write): measured on the GPU machine, 16 writers reached the
// speed of one at 14 times its CPU time (bench/NOTES.md §4). From host memory a second writer
// only waits for that lock. From GPU memory one writer that copies the next chunk (and the next
// task's first) during each write matches two: on an H200, measured as issue 14's "today" was,
// 0.99x their speed at 0.49x their CPU (0.155 to 0.192 CPU-s/GiB, 8 rounds:
// bench/results/2026-12-02-d445ebe-h200-write-rounds/), and 1.55 to 1.69x 5e45e38's speed in
// fresh processes of `ferry write` (bench/results/2026-12-02-25e01ef-h200-slot-chunks/).
constexpr std::size_t kBufferedWriters = 1;

std::size_t PosixBackend::max_workers(const core::RequestContext& c) const {
  if (c.op != Op::kWrite || c.file.direct_fd() >= 0) return SIZE_MAX;
  return kBufferedWriters;
}

std::string PosixBackend::describe(const core::RequestContext& c) const {
  return describe(c.op, c.memory, c.settings, c.file.direct_fd() >= 0, c.workers);
}

std::string PosixBackend::describe(Op op, const MemoryInfo& memory, const Settings& settings,
                                   bool direct, std::size_t workers) const {
  const char* call = op == Op::kRead ? (direct ? "O_DIRECT pread" : "pread")
                                     : (direct ? "O_DIRECT pwrite" : "pwrite");
  if (is_gpu(memory.kind)) {
    const io::StagingNode node = io::staging_node(memory.device);
    return fmt::format(
        "{} through pinned staging buffers ({} x {} per thread, {} thread(s){}), {} "
        "GPU {} on streams ordered after the default stream",
        call, kPipelineDepth, format_size(bounce_size(settings)), workers,
        node.node >= 0 ? fmt::format(", on NUMA node {}, the GPU's", node.node) : "",
        op == Op::kRead ? "copied to" : "copied from", memory.device);
  }
  return fmt::format("{} {} the {} buffer{} ({} thread(s))", call,
                     op == Op::kRead ? "straight into" : "straight from", to_string(memory.kind),
                     direct ? ", through aligned staging buffers where unaligned" : "", workers);
}

}  // namespace ferry::posix
