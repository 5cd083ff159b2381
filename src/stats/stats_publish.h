// The writer's side of a published segment (docs/stats.md): making its memory (a 0600 file in
// the stats directory, linked under ferry.<uid>.<pid> only once its header is complete, or
// anonymous memory when not publishing), withdrawing it, and the facts about this process that
// its header records. Used by stats.cc under its registry lock.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "stats/stats_layout.h"

namespace ferry::statistics {

struct ProcessIdentity {
  std::uint64_t pid = 0;
  std::uint64_t uid = 0;
  std::uint64_t start_ticks = 0;      // /proc/<pid>/stat field 22; 0 when unknown
  std::uint64_t started_unix_ns = 0;  // 0 when unknown
  char comm[32] = {};
};
ProcessIdentity this_process();

// The memory of one segment. `path` is set while the file is linked under its name.
struct SegmentMemory {
  std::atomic<std::uint64_t>* words = nullptr;
  std::size_t bytes = 0;
  std::size_t slots = stats_layout::kSlots;  // slots it has room for
  bool static_storage = false;  // the last resort of create_private_segment(): never unmapped
  std::string path;
  dev_t dev = 0;
  ino_t ino = 0;
};

// A new segment in `directory`, its header written for `who`, linked under its name; nullopt and
// `why` when that fails (no directory, name taken by another user, no space...). Every page is
// reserved before it is mapped: `*no_space` (when not null) is set when the directory had no
// room for them.
std::optional<SegmentMemory> create_published_segment(const std::string& directory,
                                                      const ProcessIdentity& who,
                                                      std::uint64_t counting_since_ns,
                                                      std::string* why, bool* no_space = nullptr);
// Anonymous memory with the same layout, for a process that does not publish (a static block
// where none can be mapped). Never fails.
SegmentMemory create_private_segment(const ProcessIdentity& who, std::uint64_t counting_since_ns);
// Removes the segment's name, if the file under it is still this one. The memory stays.
void withdraw_segment(SegmentMemory& segment);
void unmap_segment(SegmentMemory& segment);

// After this returns, every other thread of the process has run a full memory barrier
// (membarrier(2)); false where the kernel offers no way to do that.
bool heavy_barrier(std::string* why);

// The process's start time in clock ticks since boot (/proc/<pid>/stat field 22); 0 when it
// cannot be read. `stat_text` is that file's content; `state` (when not null) gets field 3
// ('Z' for a zombie), '?' when unknown.
std::uint64_t parse_start_ticks(const std::string& stat_text, char* state);
std::uint64_t read_start_ticks(long pid, char* state);

// ferry.<uid>.<pid>; parse_segment_name() is its inverse, false for any other name.
std::string segment_name(std::uint64_t uid, std::uint64_t pid);
bool parse_segment_name(const std::string& name, std::uint32_t* uid, int* pid);

std::uint64_t unix_now_ns();

// Removes the segments in `directory` of processes of `uid` that have exited (stats_reader.cc);
// a process that begins publishing calls it, so killed processes' segments do not pile up where
// no reader runs. Returns how many it removed.
std::size_t remove_dead_segments(const std::string& directory, std::uint32_t uid);

// FERRY_STATS_PUBLISH: true unless it says 0/off/false/no; a malformed value also turns
// publishing off, and `why` gives its error.
bool publish_from_environment(std::string* why);

}  // namespace ferry::statistics
