// GatheredRead: the loader's read of one shard's tensors. On a local file it is one
// File::pread_gather. On a remote object (http://, https://, s3://), where each task is one GET,
// neighbouring tensors smaller than `task_size` are coalesced into spans of about `task_size`
// (small gaps between them read and dropped), each span read into host memory of its own and
// copied into its tensors once it has landed; a tensor of `task_size` or more is read straight
// into its place. One thread uses a GatheredRead; its destructor waits for its reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "checkpoint/progress_meter.h"
#include "ferry/file.h"

namespace ferry::checkpoint {

// Gaps between tensors up to this many bytes are read with them and dropped (safetensors packs
// its tensors; writers that align them leave gaps of a few bytes to a page).
constexpr std::uint64_t kMaxSpanGap = 64 << 10;

// How ranges are read: `direct` into their own buffers, `spans` into one staging allocation (each
// span's buffer is its offset in it, as a pointer), `pieces` copied from that allocation into
// the ranges' buffers once the spans have landed.
struct SpanPlan {
  struct Piece {
    std::size_t from = 0;  // offset in the staging allocation
    void* to = nullptr;
    std::size_t size = 0;
  };
  std::vector<ReadRange> direct;
  std::vector<ReadRange> spans;
  std::vector<Piece> pieces;
  std::uint64_t staged_bytes = 0;  // the staging allocation's size
};

// The plan for `ranges` of a remote object: in file order, ranges under `task_size` join the span
// before them while it stays within `task_size` and the gap is at most `max_gap`; a span of one
// range, and every range of `task_size` or more, is read direct. Ranges of 0 bytes are dropped.
SpanPlan plan_spans(std::span<const ReadRange> ranges, std::size_t task_size,
                    std::uint64_t max_gap = kMaxSpanGap);

class GatheredRead {
 public:
  // Starts reading `ranges` (kept by the caller until this is destroyed) from `file`.
  GatheredRead(File& file, std::span<const ReadRange> ranges);
  GatheredRead(GatheredRead&&) noexcept = default;
  GatheredRead& operator=(GatheredRead&&) noexcept = default;
  ~GatheredRead() { wait(); }

  // Waits for every read, calling meter's report meanwhile (ProgressMeter::wait).
  void wait(ProgressMeter& meter, const std::function<std::uint64_t()>& done) const;
  void wait() const;
  // The ranges' bytes landed so far (at most their total).
  std::uint64_t progress() const;
  // Waits, copies the spans' bytes into their ranges' buffers; the ranges' bytes, or the first
  // read's error (then no range's buffer is known to hold its bytes). Once.
  std::size_t get();
  // One route report per request made (one, or two where spans were staged).
  std::vector<RouteReport> routes() const;

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char[], Free> staging_;  // destroyed after the futures below, which wait
  SpanPlan plan_;
  std::uint64_t wanted_ = 0;
  std::vector<IoFuture> futures_;
};

}  // namespace ferry::checkpoint
