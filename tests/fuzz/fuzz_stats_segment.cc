// Fuzzes the reader of published stats segments (src/stats/stats_segment.cc) and the parsers
// beside it (segment file names, /proc/<pid>/stat). The input builds a segment of the layout's
// size: byte 0 says whether it starts from a valid header, where the rest of the input lands
// (over the header, or over the slots), how long the segment claims to be, and whether the
// source changes between reads (a writer mid-update, a fold in progress, a file that shrinks).
// Nothing may crash or hang; a segment read without a problem has a valid header and counts
// exactly the words of its slots.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz/fuzz_check.h"
#include "stats/stats_layout.h"
#include "stats/stats_publish.h"
#include "stats/stats_segment.h"

namespace {

namespace L = ferry::statistics::stats_layout;

// A segment in memory whose reads may disturb it: every `every`-th read flips a word, or the
// size drops after some reads.
class Fickle : public ferry::statistics::SegmentSource {
 public:
  Fickle(std::vector<std::uint64_t>& words, std::uint64_t size, unsigned mode, std::uint8_t seed)
      : words_(words), size_(size), mode_(mode), seed_(seed) {}
  std::uint64_t size() override { return size_; }
  bool read(std::uint64_t offset, std::size_t count, std::uint64_t* out) override {
    ++reads_;
    if ((mode_ & 1) && reads_ % (1 + seed_ % 5) == 0) {
      words_[L::kHFold] += 1;  // a fold begins or ends
    }
    if ((mode_ & 2) && reads_ % (1 + seed_ % 3) == 0) {
      const std::size_t slot = seed_ % L::kSlots;
      words_[L::kPageWords + slot * L::kSlotWords + L::kSlotEnd] += 1;  // an update begins
    }
    if ((mode_ & 4) && reads_ > seed_) size_ = size_ / 2;  // the file shrinks
    const std::uint64_t bytes = words_.size() * 8;
    if (offset > bytes || offset > size_ || count > (std::min(bytes, size_) - offset) / 8) {
      return false;
    }
    std::memcpy(out, reinterpret_cast<const char*>(words_.data()) + offset, count * 8);
    return true;
  }

 private:
  std::vector<std::uint64_t>& words_;
  std::uint64_t size_;
  unsigned mode_;
  std::uint8_t seed_;
  unsigned reads_ = 0;
};

void valid_header(std::vector<std::uint64_t>& w) {
  w[L::kHMagic] = L::kMagic;
  w[L::kHVersion] = L::kVersion;
  w[L::kHHeaderBytes] = L::kHeaderBytes;
  w[L::kHSlotBytes] = L::kSlotBytes;
  w[L::kHSlotCount] = L::kSlots;
  w[L::kHSegmentBytes] = L::kSegmentBytes;
  w[L::kHBuckets] = L::kBuckets;
  w[L::kHReasonWords] = L::kReasonWords;
  w[L::kHHistBuckets] = L::kHistBuckets;
  w[L::kHHighWater] = L::kFirstThreadSlot;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ferry::statistics;
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The parsers next to the reader.
  std::uint32_t uid = 0;
  int pid = 0;
  if (parse_segment_name(text, &uid, &pid)) {
    FUZZ_CHECK(pid > 0);
    FUZZ_CHECK(segment_name(uid, static_cast<std::uint64_t>(pid)) == text);
  }
  char state = 0;
  (void)parse_start_ticks(text, &state);

  if (size < 3) return 0;
  const std::uint8_t flags = data[0];
  const std::uint8_t seed = data[2];
  std::vector<std::uint64_t> words(L::kSegmentBytes / 8, 0);
  if (flags & 0x01) valid_header(words);
  if (flags & 0x40) words[L::kHHighWater] = seed % (L::kSlots + 2);
  // The rest of the input over the header (0x02) or over the slots, from a word the seed picks.
  const std::size_t rest = size - 3;
  const std::size_t start_word = (flags & 0x02)
                                     ? seed % L::kHeaderUsedWords
                                     : L::kPageWords + seed * 37u % (L::kSlots * L::kSlotWords);
  const std::size_t room = (words.size() - start_word) * 8;
  std::memcpy(reinterpret_cast<char*>(words.data() + start_word), data + 3, std::min(rest, room));
  // How long the segment says it is.
  std::uint64_t claimed = L::kSegmentBytes;
  switch (data[1] % 4) {
    case 1:
      claimed = data[1] * 64u;
      break;
    case 2:
      claimed = L::kHeaderBytes + seed * 8u;
      break;
    case 3:
      claimed = L::kSegmentBytes - 8;
      break;
    default:
      break;
  }
  Fickle source(words, claimed, (flags >> 3) & 7, seed);
  ReadPolicy quick;
  quick.attempts = 1 + (flags >> 7) * 4;
  const SegmentRead r = read_segment(source, quick);
  if (r.problem != SegmentProblem::kNone) {
    FUZZ_CHECK(!r.message.empty());
    return 0;
  }
  FUZZ_CHECK(r.header[L::kHMagic] == L::kMagic && r.header[L::kHVersion] == L::kVersion);
  FUZZ_CHECK(r.slots_read <= L::kSlots);
  if (((flags >> 3) & 7) == 0) {
    // A source that never changed: the sum is exactly that of the slots' words.
    for (std::size_t w = L::kSlotFirstData; w < L::kSlotUsedWords; ++w) {
      std::uint64_t expect = 0;
      for (std::size_t i = 0; i < r.slots_read; ++i) {
        expect += words[L::kPageWords + i * L::kSlotWords + w];
      }
      FUZZ_CHECK(r.sum[w] == expect);
    }
  }
  return 0;
}
