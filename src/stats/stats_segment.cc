#include "stats/stats_segment.h"

#include <chrono>
#include <cstring>
#include <string>

namespace ferry::statistics {
namespace L = stats_layout;
namespace {

#if defined(__x86_64__) || defined(__i386__)
constexpr bool kOrderedLoads = true;  // TSO: a copy's loads are performed in order
#else
constexpr bool kOrderedLoads = false;
#endif

SegmentRead problem(SegmentRead r, SegmentProblem p, std::string message) {
  r.problem = p;
  r.message = std::move(message);
  return r;
}

struct Expected {
  std::size_t word;
  const char* name;
  std::uint64_t value;
};

constexpr Expected kLayoutWords[] = {
    {L::kHHeaderBytes, "header_bytes", L::kHeaderBytes},
    {L::kHSlotBytes, "slot_bytes", L::kSlotBytes},
    {L::kHSlotCount, "slot_count", L::kSlots},
    {L::kHSegmentBytes, "segment_bytes", L::kSegmentBytes},
    {L::kHBuckets, "memories", L::kBuckets},
    {L::kHReasonWords, "reason_words", L::kReasonWords},
    {L::kHHistBuckets, "latency_buckets", L::kHistBuckets},
};

}  // namespace

BufferSource::BufferSource(const void* data, std::size_t bytes)
    : data_(static_cast<const char*>(data), bytes), bytes_(bytes) {}

bool BufferSource::read(std::uint64_t offset, std::size_t count, std::uint64_t* out) {
  if (offset > bytes_ || count > (bytes_ - offset) / 8) return false;
  std::memcpy(out, data_.data() + offset, count * 8);
  return true;
}

SegmentRead read_segment(SegmentSource& source, const ReadPolicy& policy) {
  SegmentRead r;
  const std::uint64_t size = source.size();
  if (size < L::kHeaderBytes) {
    return problem(std::move(r), SegmentProblem::kTooSmall,
                   "the segment holds " + std::to_string(size) + " bytes, less than its header (" +
                       std::to_string(L::kHeaderBytes) + ")");
  }
  if (!source.read(0, L::kPageWords, r.header.data())) {
    return problem(std::move(r), SegmentProblem::kIo, "the segment's header cannot be read");
  }
  const auto& h = r.header;
  if (h[L::kHMagic] != L::kMagic) {
    return problem(std::move(r), SegmentProblem::kNotASegment,
                   "not a ferry stats segment (its first 8 bytes are not the magic number)");
  }
  if (h[L::kHVersion] != L::kVersion) {
    return problem(std::move(r), SegmentProblem::kVersion,
                   "layout version " + std::to_string(h[L::kHVersion]) +
                       ", and this reader knows version " + std::to_string(L::kVersion) +
                       " only (a ferry of another version wrote it)");
  }
  for (const Expected& e : kLayoutWords) {
    if (h[e.word] != e.value) {
      return problem(std::move(r), SegmentProblem::kLayout,
                     std::string("corrupt header: ") + e.name + " is " + std::to_string(h[e.word]) +
                         ", version " + std::to_string(L::kVersion) + " has " +
                         std::to_string(e.value));
    }
  }
  if (size < L::kSegmentBytes) {
    return problem(std::move(r), SegmentProblem::kTooSmall,
                   "the segment holds " + std::to_string(size) + " bytes, and its header says " +
                       std::to_string(L::kSegmentBytes));
  }
  int budget = policy.attempts;
  const auto started = std::chrono::steady_clock::now();
  // budget_ns bounds the time since the writer last moved: a version word that changed between
  // two looks is a writer that finished an update (alive, only busy), and the wait starts over;
  // one that stays mid-update is stuck (or kept so on purpose). Counting from the first look
  // instead made a reader descheduled on a loaded machine give up on a healthy, busy process.
  // `attempts` still bounds a writer that keeps moving forever.
  auto moved_at = started;
  int stalled = 0;
  int looks = 0;
  auto wait = [&](bool moved) {
    ++looks;
    const auto now = std::chrono::steady_clock::now();
    if (moved) {
      moved_at = now;
      stalled = 0;
    }
    if (policy.budget_ns != 0 &&
        static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(now - moved_at).count()) >=
            policy.budget_ns) {
      return false;
    }
    if (policy.pause) policy.pause(stalled++);
    return --budget > 0;
  };
  std::uint64_t word = 0;
  std::uint64_t fold_seen = 0;
  bool fold_looked = false;
  for (;;) {
    // Outer sequence: a thread's counts moving into the retired slot.
    std::uint64_t fold_before = 0;
    if (!source.read(L::kHFold * 8, 1, &fold_before)) {
      return problem(std::move(r), SegmentProblem::kIo, "the segment cannot be read");
    }
    const bool fold_moved = !fold_looked || fold_before != fold_seen;
    fold_seen = fold_before;
    fold_looked = true;
    if (fold_before & 1) {
      if (!wait(fold_moved)) break;
      continue;
    }
    if (!source.read(L::kHHighWater * 8, 1, &word)) {
      return problem(std::move(r), SegmentProblem::kIo, "the segment cannot be read");
    }
    if (word > L::kSlots) {
      return problem(std::move(r), SegmentProblem::kLayout,
                     "corrupt header: " + std::to_string(word) + " slots in use, of " +
                         std::to_string(L::kSlots));
    }
    const std::size_t high = static_cast<std::size_t>(word);
    SlotSum sum{};
    std::array<std::uint64_t, L::kSlotWords> slot{};
    bool gave_up = false;
    for (std::size_t i = 0; i < high && !gave_up; ++i) {
      const std::uint64_t at = L::kHeaderBytes + i * L::kSlotBytes;
      std::uint64_t seen[2] = {};
      bool looked = false;
      for (;;) {
        // The versions equal, the copy, the versions still the same: no update began before the
        // second look (`end` is stored first) and the last one ended before the first (`begin`
        // is stored last), so the copy holds no update's middle.
        std::uint64_t look[2] = {};
        if (!source.read(at, 2, look) || !source.read(at, L::kSlotWords, slot.data())) {
          return problem(std::move(r), SegmentProblem::kIo,
                         "slot " + std::to_string(i) + " cannot be read (the segment shrank?)");
        }
        std::uint64_t again[2] = {};
        bool whole = look[0] == look[1] && source.read(at, 2, again) && again[0] == look[0] &&
                     again[1] == look[1] && slot[L::kSlotBegin] == look[0] &&
                     slot[L::kSlotEnd] == look[1];
        if (whole && !kOrderedLoads) {
          // Where loads may pass loads, a second copy must agree with the first.
          std::array<std::uint64_t, L::kSlotWords> copy{};
          whole = source.read(at, L::kSlotWords, copy.data()) && copy == slot;
        }
        if (whole) break;
        // A slot's first look counts as progress: the slots before it were read whole.
        const bool moved = !looked || look[0] != seen[0] || look[1] != seen[1];
        seen[0] = look[0];
        seen[1] = look[1];
        looked = true;
        if (!wait(moved)) {
          gave_up = true;
          break;
        }
      }
      if (gave_up) break;
      for (std::size_t w = L::kSlotFirstData; w < L::kSlotUsedWords; ++w) sum[w] += slot[w];
    }
    if (gave_up) break;
    std::uint64_t fold_after = 0;
    if (!source.read(L::kHFold * 8, 1, &fold_after)) {
      return problem(std::move(r), SegmentProblem::kIo, "the segment cannot be read");
    }
    if (fold_after == fold_before) {
      r.sum = sum;
      r.slots_read = high;
      r.header[L::kHHighWater] = high;
      r.header[L::kHFold] = fold_after;
      return r;
    }
    if (!wait(fold_after != fold_before)) break;
  }
  const auto spent = std::chrono::duration_cast<std::chrono::microseconds>(
                         std::chrono::steady_clock::now() - started)
                         .count();
  return problem(std::move(r), SegmentProblem::kBusy,
                 "busy (mid-update): its counters stayed mid-update through " +
                     std::to_string(looks) + " attempts in " + std::to_string(spent) +
                     " us (a writer stopped inside an update, or a damaged slot)");
}

}  // namespace ferry::statistics
