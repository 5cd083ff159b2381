// The reader of a published segment (stats_layout.h, docs/stats.md), over any source of bytes:
// the segment's file (read with pread, never mapped, so a file cut short under the reader is an
// error and not SIGBUS), or a buffer (tests, the fuzz target). Nothing in the segment is trusted:
// every header field is checked against the layout before any slot is read, and a slot counts
// only when its sequence word is even and unchanged across the read. Self-contained (no other
// part of libferry), so the fuzz target builds it alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "stats/stats_sum.h"

namespace ferry::statistics {

class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  // The segment's size in bytes now.
  virtual std::uint64_t size() = 0;
  // Copies `count` words from byte `offset` (a multiple of 8) into `out`; false when the source
  // holds fewer bytes or cannot be read.
  virtual bool read(std::uint64_t offset, std::size_t count, std::uint64_t* out) = 0;
};

enum class SegmentProblem {
  kNone,
  kTooSmall,     // shorter than its header or than the header says
  kNotASegment,  // wrong magic
  kVersion,      // a layout version this reader does not know
  kLayout,       // a header field that differs from this version's layout
  kBusy,         // counters kept changing (or a slot stayed mid-update) through every attempt
  kIo,           // the source failed
};

struct SegmentRead {
  SegmentProblem problem = SegmentProblem::kNone;
  std::string message;  // what was wrong, when problem != kNone
  std::array<std::uint64_t, stats_layout::kPageWords> header{};
  SlotSum sum{};
  std::size_t slots_read = 0;
};

struct ReadPolicy {
  int attempts = 2000;                  // reads of sequence words that may find them busy
  std::function<void(int)> pause = {};  // called between attempts (a short sleep), may be empty
  // The most time the attempts may take, in nanoseconds (0: no limit): a segment that another
  // user keeps mid-update on purpose must not cost each reader more than this.
  std::uint64_t budget_ns = 0;
};

SegmentRead read_segment(SegmentSource& source, const ReadPolicy& policy = {});

// A source over bytes in memory (copied); reads past the end fail.
class BufferSource : public SegmentSource {
 public:
  BufferSource(const void* data, std::size_t bytes);
  std::uint64_t size() override { return bytes_; }
  bool read(std::uint64_t offset, std::size_t count, std::uint64_t* out) override;

 private:
  std::string data_;
  std::size_t bytes_;
};

}  // namespace ferry::statistics
