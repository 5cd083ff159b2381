// The route report: how one request was served, at both layers. Layer 1 is ferry's own choice
// between cuFile and its POSIX path; layer 2 is what cuFile did with the requests it received
// (nvidia-fs, its POSIX compatibility path, or PCI P2PDMA). A report is a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/memory.h"

namespace ferry {

enum class Op { kRead, kWrite };
enum class Path { kPosix, kCufile };

// Why a request (or part of it) took the path it took. Stable names: see to_string().
enum class ReasonCode {
  kCompatModeOn,       // "compat_mode=on": cuFile is never called.
  kHostBuffer,         // cuFile serves GPU memory only.
  kBelowThreshold,     // the request is smaller than gds_threshold.
  kCufileUnavailable,  // libcufile missing, driver open failed, handle registration failed...
  kCufileCompatOnly,   // auto: cuFile could only use its compatibility path, which is slower.
  kPageCacheResident,  // auto: the range is in the page cache, which ferry's POSIX path reads.
  kColdDirect,         // tasks whose pages were not cached were read with O_DIRECT.
  kNoCudaDriver,       // libcuda could not be loaded: only host memory is possible.
  kDirectIoRefused,    // the file system refused O_DIRECT: buffered I/O instead.
  kEngine,             // how the POSIX path moved the bytes (pread/pwrite, staging buffers).
  kRemoteSource,       // the file is a remote object (http, https, s3): ranged GETs, no cuFile.
};
std::string to_string(ReasonCode code);

struct RouteReason {
  ReasonCode code;
  std::string text;
};

// What cuFile's own counters say about the pieces it served. `observable` is false when the
// counters could not be read (no cuFile, unknown stats layout); `why_not` then says why.
// `shared_window` is true when other requests ran at the same time, so the counts are those
// of the whole window, not of this request alone.
// Pieces are cuFile's scheduling units: it cuts one request into up to max_request_parallelism
// pieces of at least min_io_threshold_size_kb. `compat_why` says why cuFile used its POSIX
// compatibility path when it did. The module_* fields are nvidia-fs's own counters
// (/proc/driver/nvidia-fs/stats), a system-wide second witness: other processes add to them,
// and they count only with the module's rw_stats_enabled=1.
struct CufileCounts {
  bool observable = false;
  std::string why_not;
  // The window: shared with another request counted in the same entry (cuFile's entry of the
  // request's GPU, or every entry when the GPU's cannot be named).
  bool shared_window = false;
  // The GPU whose per-GPU entry of cuFile's counters held this request's pieces, matched by
  // UUID; -1 when they were summed over every GPU's entry (`counted_over` says why).
  int gpu_entry = -1;
  std::string counted_over;
  std::uint64_t nvfs = 0;
  std::uint64_t posix = 0;
  std::uint64_t p2p = 0;
  int version = 0;  // cuFileGetVersion(), 0 when unknown
  std::string compat_why;
  // Under require=gds, when the window was shared and held non-nvfs pieces: why the request was
  // not judged (they may be another request's). Empty otherwise.
  std::string unjudged;
  bool module_observable = false;
  std::string module_why_not;
  std::uint64_t module_ops = 0;  // growth of nvidia-fs's Reads (or Writes) n
};

// How much of the requested range was in the page cache just before the request, measured
// without reading it (cachestat(2), or mincore(2) where the kernel lacks it). `estimated` is true
// when mincore sampled a large range instead of checking every page.
struct PageCacheResidency {
  bool known = false;
  std::string why_not;         // when not known
  std::uint64_t resident = 0;  // bytes of the range in the page cache
  std::uint64_t bytes = 0;     // bytes of the range
  bool estimated = false;
  std::string method;  // "cachestat", "mincore" or "test"
  double fraction() const { return bytes == 0 ? 1.0 : static_cast<double>(resident) / bytes; }
};

// The source layer of a request on a remote object (http://, https://, s3://): the ranged GETs
// its tasks made, counted between its first task and its last. `remote` is false for local
// files. `shared_window`: another request on the same object ran meanwhile, so the counts may
// hold some of its GETs too. No field ever holds a credential or a presigned URL's query.
struct SourceCounts {
  bool remote = false;
  std::string url;                // without query, fragment or user:password
  std::string auth;               // how the GETs were authenticated, in words
  std::uint64_t gets = 0;         // ranged GETs that succeeded
  std::uint64_t retries = 0;      // attempts that failed and were tried again
  std::uint64_t connections = 0;  // connections opened (others were kept alive from before)
  std::uint64_t bytes = 0;        // bytes received into ferry's buffers
  std::string retried;            // why, e.g. "HTTP 503 x2, connection reset x1"
  bool shared_window = false;
  // The server ignores Range (it answers a ranged GET with the whole object): the bytes were cut
  // out of whole-object answers as they streamed, in order, on one worker; `gets` counts those
  // GETs, and `discarded` the bytes received before the ranges asked for and thrown away.
  bool range_ignored = false;
  std::uint64_t discarded = 0;
};

struct RouteReport {
  Op op = Op::kRead;
  std::string file;
  MemoryKind memory = MemoryKind::kHostPageable;
  int device = -1;
  std::uint64_t offset = 0;
  std::uint64_t requested = 0;  // bytes asked for
  std::uint64_t bytes = 0;      // bytes moved
  std::size_t tasks = 0;
  // A gathered read (pread_gather, pread_ranges): the ranges asked for, and the runs they made
  // once adjacent ones were coalesced. 0 for one-range requests.
  std::size_t ranges = 0;
  std::size_t runs = 0;
  double seconds = 0;
  bool direct = false;            // O_DIRECT was used
  std::size_t workers = 0;        // threads that ran the request's tasks
  PageCacheResidency page_cache;  // residency of the range before the request
  std::size_t direct_tasks = 0;   // POSIX tasks read with O_DIRECT because their pages were cold
  // Layer 1.
  std::size_t posix_tasks = 0;
  std::size_t cufile_tasks = 0;
  std::vector<RouteReason> reasons;
  // Layer 2.
  CufileCounts cufile;
  // Below both layers for a remote object: what the network did.
  SourceCounts source;

  // One sentence saying what happened and why.
  std::string verdict() const;
  // A few lines for people: the verdict, then each layer with its reasons.
  std::string to_text() const;
  // A stable JSON object (documented in docs/data-paths.md).
  std::string to_json() const;
};

std::string to_string(Op op);
std::string to_string(Path path);
// "7.9 GiB of 8 GiB resident (99%, cachestat)", or "unknown: why".
std::string describe(const PageCacheResidency& residency);

}  // namespace ferry
