// ferry::Checkpoint: a safetensors checkpoint (one file, a directory of shards, or a
// model.safetensors.index.json), its headers validated before any tensor byte is read, and loads
// of all or some of its tensors into one GPU or host memory, one gathered request per part (a
// shard's tensors, cut at 1 GiB by load()).
// A Checkpoint is immutable once opened; loads from several threads at once are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/error.h"
#include "ferry/file.h"
#include "ferry/memory.h"
#include "ferry/route.h"
#include "ferry/settings.h"

namespace ferry {

// Every dtype of the safetensors format. Names are the format's own ("BF16", "F8_E4M3"...).
enum class Dtype {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kF16,
  kBF16,
  kU32,
  kI32,
  kF32,
  kU64,
  kI64,
  kF64,
  kC64,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
  kF6E2M3,
  kF6E3M2,
  kF4,
  kF8E4M3FNUZ,
  kF8E5M2FNUZ,
};
std::string_view to_string(Dtype dtype);
// The dtype named `name` exactly as the format spells it, or nullopt.
std::optional<Dtype> parse_dtype(std::string_view name);
// Bits per element: 4 and 6 for the packed MX kinds, else 8 times the byte size.
unsigned dtype_bits(Dtype dtype);
// Every dtype, in the enumeration's order: ferry's one dtype table, which Python reads too.
std::span<const Dtype> all_dtypes();

// A checkpoint that does not describe its bytes (bad header, unknown dtype, overlapping ranges,
// an index naming a missing shard...). The message names the file and, where one is at fault,
// the tensor.
class CheckpointError : public Error {
 public:
  CheckpointError(std::string file, std::string tensor, const std::string& message);
  const std::string& file() const { return file_; }
  const std::string& tensor() const { return tensor_; }

 private:
  std::string file_;
  std::string tensor_;
};

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<std::uint64_t> shape;  // empty: a scalar
  std::uint64_t file_offset = 0;     // where its bytes start in its shard
  std::uint64_t nbytes = 0;
  std::size_t shard = 0;  // index into Checkpoint::shards()
};

// A whole safetensors file held in memory (safetensors' `load(bytes)`), its header validated as a
// file's is; each tensor's file_offset is where its bytes start in `bytes`, in the order of the
// bytes. Throws CheckpointError naming `name` (and the tensor at fault).
struct SafetensorsContents {
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsContents parse_safetensors(std::string_view bytes, const std::string& name = "<bytes>");

// Where one tensor's bytes go: bytes [begin, begin + length) of the tensor (all of it by default)
// into `length` bytes of writable host or GPU memory.
struct TensorTarget {
  static constexpr std::uint64_t kToTheEnd = UINT64_MAX;
  std::size_t tensor = 0;  // index into Checkpoint::tensors()
  void* buffer = nullptr;
  std::uint64_t begin = 0;
  std::uint64_t length = kToTheEnd;
};

// How a load into pageable host memory served one shard (settings' host_load): "mapped", its
// tensors views of a private mapping of the file (LoadResult::mappings) that fault in on first
// touch; "populated", mapped so and every page read in by parallel faults before the load
// returns (a cold shard); or "read" by ferry's parallel read (the shard's requests in
// LoadReport::routes); `reason` says why in words.
struct HostRoute {
  std::string file;
  std::string path;  // "mapped", "populated" or "read"
  std::string reason;
  PageCacheResidency page_cache;  // of the shard's chosen bytes, where measured
  std::size_t tensors = 0;        // mapped or populated: the tensors that are views of the mapping
  std::uint64_t bytes = 0;        // mapped or populated: their bytes
  // Mapped: tensors whose offset in the file is not a multiple of their dtype's size, which no
  // framework can view in place: read into memory of their own instead (in `routes`).
  std::size_t copied = 0;
  // "model.safetensors: mapped: resident in the page cache (...) (3 tensors, 4096 B in place)".
  std::string describe() const;
};

// How a load went: the whole of it, and one route report per shard request.
struct LoadReport {
  std::uint64_t bytes = 0;  // the tensors' (or the targets') bytes, mapped ones included
  // What the tensors' reads took from storage: `bytes` less those mapped (not read), plus a remote
  // checkpoint's gaps read between coalesced tensors (the routes' bytes).
  std::uint64_t bytes_read = 0;
  // The reads that opening the checkpoint made and their bytes: its headers (a DCP folder's
  // .metadata and blob headers). Opening happens once per Checkpoint: every load of it repeats
  // these.
  std::uint64_t open_reads = 0;
  std::uint64_t open_bytes = 0;
  std::size_t tensors = 0;
  double seconds = 0;  // from the call until every byte had landed
  // Of `seconds`, the time Checkpoint::load spent allocating the tensors' memory (0 for
  // read_into, whose caller allocates); reads already submitted run meanwhile.
  double allocate_seconds = 0;
  std::vector<RouteReport> routes;
  std::vector<HostRoute> host_routes;  // a load into pageable host memory: one per shard
  // A DCP folder's byte items (pickled non-tensor values such as a learning rate), which a load
  // lists here rather than loads.
  std::vector<std::string> skipped;
  // Of a remote checkpoint, the GETs its tensors took (neighbouring tensors share one), the
  // attempts retried and the connections opened; the sums of the routes' source layers (0 for
  // local files).
  std::uint64_t gets = 0;
  std::uint64_t retries = 0;
  std::uint64_t connections = 0;
  // One line: tensors, bytes, seconds, GB/s, the requests (and a remote checkpoint's GETs) and
  // the shards' routes.
  std::string summary() const;
  std::string to_json() const;
};

struct LoadedTensor {
  std::string name;
  Dtype dtype = Dtype::kU8;
  std::vector<std::uint64_t> shape;
  void* data = nullptr;  // host or device pointer, owned by the LoadResult
  std::uint64_t nbytes = 0;
  // Where `data` lies: in LoadResult::mappings[memory] when `mapped`, else in allocation `memory`
  // (LoadResult::memory, or the `memory`th call of LoadOptions::allocate).
  bool mapped = false;
  std::size_t memory = 0;
};

// A private, copy-on-write mapping of bytes [offset, offset + size) of a shard (`offset` a
// multiple of the page size): the memory of a mapped host load's tensors. Writes to it never
// reach the file, and it stays valid once the file is closed or deleted (not if the file is
// truncated under it: its pages past the new end then fault with SIGBUS, as any mapping's do).
// Unmapped when destroyed. Its bytes are plain memory: thread-safe as such.
class FileMapping {
 public:
  // Maps [offset, offset + size) of the open descriptor `fd` of `file` (named in errors); throws
  // IoError. The descriptor may be closed once this returns.
  FileMapping(int fd, std::uint64_t offset, std::uint64_t size, std::string file);
  ~FileMapping();
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;
  void* data() const { return data_; }
  std::uint64_t offset() const { return offset_; }
  std::uint64_t size() const { return size_; }
  const std::string& file() const { return file_; }

 private:
  void* data_ = nullptr;
  std::uint64_t offset_ = 0;
  std::uint64_t size_ = 0;
  std::string file_;
};

// How a load or a save tells its caller how far it has got (LoadOptions::progress,
// Checkpoint::read_into, SaveOptions::progress). `callback(done, total)`: `done` of `total` bytes
// have landed (a load) or been written (a save: every shard's bytes, headers included). It is
// called from the thread that called the load or save, while that thread waits for its requests:
// at most once per `interval_seconds`, `done` never going down, and once with done == total when
// every byte is in place (a save: written and, when durable, synced, before the commit). Never
// after a failure. An exception it throws ends the call: the requests in flight are waited for,
// the memory a load allocated is freed, nothing of a save is committed (the old file or
// checkpoint stays whole), and the exception propagates. No callback: no cost.
struct ProgressOptions {
  std::function<void(std::uint64_t done, std::uint64_t total)> callback;
  double interval_seconds = 0.1;
};

struct LoadOptions {
  MemoryKind memory = MemoryKind::kDevice;
  int device = 0;
  std::vector<std::string> names;  // empty: every tensor
  // One allocation behind every tensor instead of one each (fewer allocator calls; the tensors
  // can then only be freed together).
  bool one_allocation = false;
  ProgressOptions progress;  // total: the chosen tensors' bytes
  // Where the memory comes from: `allocate(bytes)` returns that many writable bytes (host memory
  // or GPU `device`'s, as `memory` says, which also sets when they are asked for), owned by the
  // caller, who keeps them past the load (LoadResult::memory stays empty). It is called from the
  // thread that called load(), in the order load() allocates: once for one_allocation, else once
  // per tensor in file order. An exception it throws ends the load, as a progress callback's
  // does. None: ferry's own Buffers.
  std::function<void*(std::uint64_t bytes)> allocate;
  // Into pageable host memory: how each shard's bytes come (settings' host_load, which this
  // replaces when set). Mapped tensors take neither `allocate` nor one_allocation: they are views
  // of LoadResult::mappings.
  std::optional<HostLoad> host_load;
};

struct LoadResult {
  std::vector<LoadedTensor> tensors;
  std::vector<Buffer> memory;  // empty when LoadOptions::allocate gave the memory
  std::vector<std::shared_ptr<const FileMapping>> mappings;  // the mapped shards' bytes
  LoadReport report;
};

class Checkpoint;

// A Checkpoint::start_read_into in flight: its requests were submitted when it was made. wait()
// (once) waits for them and returns the report; destroyed unwaited, it waits for them (nothing
// writes into the caller's buffers after it is gone). Used by one thread; the Checkpoint and the
// targets' buffers must outlive it.
class PendingRead {
 public:
  PendingRead(PendingRead&&) noexcept;
  PendingRead& operator=(PendingRead&&) noexcept;
  ~PendingRead();
  // `progress`: over the targets' bytes. Throws the first failure (IoError naming the shard).
  LoadReport wait(const ProgressOptions& progress = {});

 private:
  friend class Checkpoint;
  struct State;
  explicit PendingRead(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

class Checkpoint {
 public:
  // `path`: a .safetensors file, a *.index.json (weight_map), a directory holding an index
  // or .safetensors files, or a torch.distributed.checkpoint (DCP) folder (one holding
  // `.metadata`), whose tensors are named as `.metadata` flattens them and come back whole and
  // contiguous, however they were sharded or strided. Reads and validates every header; throws
  // CheckpointError (or IoError).
  explicit Checkpoint(const std::filesystem::path& path, FileOptions options = {});
  ~Checkpoint();
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;

  const std::vector<std::string>& shards() const;
  const std::vector<TensorInfo>& tensors() const;
  // Index of the tensor named `name`; throws CheckpointError naming it when absent.
  std::size_t find(std::string_view name) const;
  // `__metadata__` of one shard (empty when it has none), and the index's "metadata" object as
  // JSON text ("{}" without an index).
  const std::map<std::string, std::string>& metadata(std::size_t shard = 0) const;
  const std::string& index_metadata_json() const;
  std::uint64_t total_bytes() const;

  // Reads every target's tensor into its buffer: one gathered request per shard, the shards at
  // once. Buffers must all be host memory or all on one GPU. `progress`: over the targets' bytes.
  LoadReport read_into(std::span<const TensorTarget> targets,
                       const ProgressOptions& progress = {}) const;
  // read_into's requests submitted, not waited for: the caller's thread goes on (allocating the
  // next tensors, say) while they run. Past 64 shards, the later ones are submitted by wait().
  PendingRead start_read_into(std::span<const TensorTarget> targets) const;
  // Allocates and reads: the tensors named in `options` (all when none), in file order, a part
  // (a shard's tensors, cut at 1 GiB) at a time: each part's read starts once its memory exists.
  // Pageable host memory is allocated before the first read; at most 4 parts are in flight.
  // Into pageable host memory, a local shard is mapped instead, and read in before the return
  // when cold (host_load).
  LoadResult load(const LoadOptions& options = {}) const;

 private:
  void open_dcp(const std::filesystem::path& path, const FileOptions& options);
  friend class PendingRead;
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ferry
