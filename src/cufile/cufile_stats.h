// Layer 2: what cuFile did with the requests ferry gave it, from cuFile's own level-3 counters
// (per GPU: pieces served through nvidia-fs, its POSIX compatibility path or PCI P2PDMA), with
// /proc/driver/nvidia-fs/stats as a second, system-wide witness where the module is loaded.
// The counters are per GPU and process-wide, so a request's delta is exact only when no other
// ferry cuFile request on the same GPU overlapped it; otherwise the report says the window was
// shared (docs/data-paths.md).
// Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cufile/cufile_library.h"
#include "cufile/cufile_machine.h"
#include "ferry/route.h"

namespace ferry::cufile {

enum class StatsLayout { kUnknown, kV1, kV2 };
// kV1 for cuFile 1.14 to 1.18, kV2 for 1.19 (CUDA 13.4 grew level 1); kUnknown otherwise.
StatsLayout stats_layout(int version);
std::string version_text(int version);  // 1150 -> "1.15"

// cuFile's pieces (reads or writes) by the path that served them: running totals.
struct PieceCounters {
  std::uint64_t total = 0;
  std::uint64_t nvfs = 0;
  std::uint64_t posix = 0;
  std::uint64_t p2p = 0;
};
// One entry of per_gpu_stats: the GPU's UUID (as cuDeviceGetUuid writes it) and its counts.
struct GpuPieceCounters {
  std::array<char, 16> uuid{};
  PieceCounters reads;
  PieceCounters writes;
};
struct StatsSnapshot {
  PieceCounters reads;  // summed over every GPU's entry
  PieceCounters writes;
  std::vector<GpuPieceCounters> gpus;  // per_gpu_stats[0, num_gpus), in cuFile's order
  // The entry whose UUID is `uuid`, or null.
  const GpuPieceCounters* find(const std::array<char, 16>& uuid) const;
};
// Reads per_gpu_stats[0, num_gpus) of a level-3 struct of `layout` (not kUnknown).
StatsSnapshot sum_per_gpu(const void* level3, StatsLayout layout);

// Called once, right after the driver opens: cuFileSetStatsLevel(3) and cuFileStatsStart().
void start_stats(const Library& library);
// Empty when layer 2 can be read, else why not.
std::string stats_unavailable();

// One request's window on the counters. begin() before the first cuFile call, end() after the
// last; end() fills report.cufile. With the request's GPU (`device` >= 0) and that GPU's UUID
// from the driver, the request is counted on its GPU's entry and its window is shared only with
// requests counted on the same entry (or on none); otherwise over every entry, shared with any
// request that overlapped it.
class Observation {
 public:
  // `machine`: where nvidia-fs's counters and GPU UUIDs are read from.
  static std::unique_ptr<Observation> begin(Op op, int device, const Machine& machine);
  ~Observation();
  void end(CufileCounts& out);
  struct Impl;  // defined in cufile_stats.cc only

 private:
  Observation() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::cufile
