// The loader: opens every shard, validates its header, and reads tensors with gathered requests
// (checkpoint::GatheredRead: File::pread_gather, a remote shard's small tensors coalesced into
// spans of about task_size): read_into one per shard, the shards' requests in flight together (at
// most kShardsReadAtOnce of them, so that descriptors stay bounded); load() one per part (a
// shard's tensors cut at kPartBytes), at most kPartsAtOnce in flight.
#include "ferry/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "checkpoint/dcp_folder.h"
#include "checkpoint/gathered_read.h"
#include "checkpoint/host_route.h"
#include "checkpoint/progress_meter.h"
#include "checkpoint/safetensors_header.h"
#include "checkpoint/shard_index.h"
#include "core/report_json.h"
#include "io/io_seam.h"

namespace ferry {

namespace fs = std::filesystem;

namespace {

// Up to this many shards stay open from the constructor on; a checkpoint with more (an MoE
// model can have thousands) closes each shard once its header is read and opens it again for a
// load, checking that its size has not changed, so that `ulimit -n 1024` is no limit.
constexpr std::size_t kShardsKeptOpen = 128;
// Shards read_into reads at once (each one gathered request), so descriptors stay bounded.
constexpr std::size_t kShardsReadAtOnce = 64;
// Parts load() keeps in flight (Python's loader is this one): on the GPU machine a
// 14.5 GB load of 291 tensors ran at 49.4 GB/s with 4 against 48.3 with 64 and 46.7 with 1
// (bench/NOTES.md §27).
constexpr std::size_t kPartsAtOnce = 4;

}  // namespace

struct Checkpoint::State {
  std::string path;  // what the checkpoint was opened as (a file, an index, a directory), shown
  FileOptions options;
  std::vector<std::string> shard_names;  // as shown: a URL without its query or credentials
  std::vector<fs::path> shard_paths;     // as opened again past kShardsKeptOpen: a URL whole
  std::vector<std::uint64_t> shard_sizes;
  std::vector<std::unique_ptr<File>> files;  // empty past kShardsKeptOpen shards
  std::vector<std::map<std::string, std::string>> metadata;
  std::vector<TensorInfo> tensors;  // shard by shard, each in file order
  std::unordered_map<std::string, std::size_t> by_name;
  std::string index_metadata = "{}";
  std::uint64_t total = 0;
  // A DCP folder's tensors are pieces of their .distcp files (empty for safetensors), and its
  // byte items, which are not tensors, are listed in every load's report.
  std::vector<std::vector<checkpoint::TensorPiece>> pieces;
  std::vector<std::string> skipped;
  std::uint64_t open_reads = 0;  // what opening read: LoadReport's open_reads, open_bytes
  std::uint64_t open_bytes = 0;

  // Where tensor `i`'s bytes lie: its one range of its shard, or a DCP tensor's pieces.
  std::vector<checkpoint::TensorPiece> pieces_of(std::size_t i) const {
    if (!pieces.empty()) return pieces[i];
    return {{tensors[i].shard, tensors[i].file_offset, tensors[i].nbytes, 0}};
  }

  // The shard's File: the one kept open, or the shard opened again, refused if it changed size
  // since its header was read (its offsets would describe another file).
  std::shared_ptr<File> open_shard(std::size_t shard) const {
    if (shard < files.size()) return std::shared_ptr<File>(files[shard].get(), [](File*) {});
    auto file = std::make_shared<File>(shard_paths[shard], "r", options);
    if (file->size() != shard_sizes[shard]) {
      throw CheckpointError(shard_names[shard], "",
                            fmt::format("it is {} B now but was {} B when its header was read",
                                        file->size(), shard_sizes[shard]));
    }
    return file;
  }
};

namespace {

// A remote shard's first read takes this much: the length field and, most often, the whole
// header with it, in one GET instead of two (a 3000-tensor header is about 250 KiB).
constexpr std::uint64_t kRemoteFirstRead = 1 << 20;

checkpoint::SafetensorsHeader read_header(File& file, std::uint64_t& reads, std::uint64_t& bytes) {
  const std::uint64_t size = file.size();
  const std::uint64_t want = io::is_remote_url(file.path())
                                 ? std::min(size, kRemoteFirstRead)
                                 : (size >= checkpoint::kLengthFieldSize ? std::uint64_t{8} : 0);
  std::string first(static_cast<std::size_t>(want), '\0');
  std::size_t got = want > 0 ? file.read(first.data(), first.size(), 0) : 0;
  first.resize(got);
  reads += want > 0;
  bytes += got;
  const std::uint64_t n =
      checkpoint::header_length(first.substr(0, checkpoint::kLengthFieldSize), size, file.path());
  std::string json = first.substr(std::min<std::size_t>(got, checkpoint::kLengthFieldSize));
  if (json.size() > n) json.resize(static_cast<std::size_t>(n));
  const std::size_t have = json.size();
  json.resize(static_cast<std::size_t>(n));
  if (have < n) {
    ++reads;
    bytes += n - have;
    if (file.read(json.data() + have, n - have, checkpoint::kLengthFieldSize + have) != n - have) {
      throw CheckpointError(file.path(), "", "the file ended inside its header");
    }
  }
  return checkpoint::parse_header(json, size, file.path());
}

// An index and its shards must agree both ways: a tensor the index names but its shard lacks
// would be missing from the model, one a shard holds but the index does not would be loaded
// without anyone asking.
void check_against_index(const checkpoint::ShardIndex& index,
                         const std::vector<TensorInfo>& tensors,
                         const std::unordered_map<std::string, std::size_t>& by_name,
                         const std::vector<std::string>& shard_names) {
  if (!index.weight_map) return;
  const std::string file = io::shown_url(index.index_file.string());
  for (const auto& [name, shard] : *index.weight_map) {
    auto it = by_name.find(name);
    if (it == by_name.end() || tensors[it->second].shard != shard) {
      throw CheckpointError(
          file, name,
          fmt::format("the index puts it in {}, which does not hold it", shard_names[shard]));
    }
  }
  for (const TensorInfo& t : tensors) {
    if (!index.weight_map->contains(t.name)) {
      throw CheckpointError(shard_names[t.shard], t.name, fmt::format("not in the index {}", file));
    }
  }
}

std::string join_verdicts(const std::vector<RouteReport>& routes) {
  std::string out;
  for (const RouteReport& r : routes) {
    out += fmt::format("{}  {}: {}", out.empty() ? "" : "\n", fs::path(r.file).filename().string(),
                       r.verdict());
  }
  return out;
}

// The routes of a shard's (or a part's) read, and the GETs, retries and connections of their
// source layers, which the load report counts.
void add_routes(LoadReport& report, const checkpoint::GatheredRead& read) {
  for (RouteReport& r : read.routes()) {
    report.gets += r.source.gets;
    report.retries += r.source.retries;
    report.connections += r.source.connections;
    report.bytes_read += r.bytes;
    report.routes.push_back(std::move(r));
  }
}

// The host route of each shard of `chosen` (indices into `tensors`, so shard by shard in file
// order), recorded in result's report, and its mapping in result.mappings when mapped (and in
// `to_populate` too when the route is "populated"). Returns,
// for each chosen tensor, the index of the mapping it is a view of, or -1 when it is to be read:
// an empty tensor, or one no framework could view in place (host_route.h).
std::vector<int> route_host_shards(HostLoad mode, bool direct,
                                   const std::vector<TensorInfo>& tensors,
                                   const std::vector<std::size_t>& chosen,
                                   const std::vector<std::string>& names,
                                   const std::vector<fs::path>& paths,
                                   const std::vector<std::uint64_t>& sizes, LoadResult& result,
                                   std::vector<const FileMapping*>& to_populate) {
  std::vector<int> in_mapping(chosen.size(), -1);
  for (std::size_t first = 0, last = 0; first < chosen.size(); first = last) {
    const std::size_t shard = tensors[chosen[first]].shard;
    std::uint64_t begin = UINT64_MAX, end = 0;
    for (last = first; last < chosen.size() && tensors[chosen[last]].shard == shard; ++last) {
      const TensorInfo& t = tensors[chosen[last]];
      if (t.nbytes == 0) continue;
      begin = std::min(begin, t.file_offset);
      end = std::max(end, t.file_offset + t.nbytes);
    }
    if (end <= begin) continue;  // nothing to read or map
    checkpoint::MappedShard m =
        checkpoint::route_shard(mode, direct, names[shard], paths[shard], sizes[shard], begin, end);
    if (m.mapping) {
      for (std::size_t k = first; k < last; ++k) {
        const TensorInfo& t = tensors[chosen[k]];
        if (t.nbytes == 0) continue;
        if (!checkpoint::viewable_in_place(t)) {
          ++m.route.copied;
          continue;
        }
        in_mapping[k] = static_cast<int>(result.mappings.size());
        ++m.route.tensors;
        m.route.bytes += t.nbytes;
      }
      if (m.route.path == "populated") to_populate.push_back(m.mapping.get());
      result.mappings.push_back(std::move(m.mapping));
    }
    result.report.host_routes.push_back(std::move(m.route));
  }
  return in_mapping;
}

constexpr std::size_t kAlignment = 256;  // what cuMemAlloc gives: enough for every dtype
// A load's part: the tensors of one shard, cut where they pass this many bytes.
constexpr std::uint64_t kPartBytes = std::uint64_t{1} << 30;

}  // namespace

Checkpoint::Checkpoint(const fs::path& path, FileOptions options)
    : state_(std::make_unique<State>()) {
  if (checkpoint::is_dcp_folder(path)) {
    open_dcp(path, options);
    return;
  }
  const checkpoint::ShardIndex index = checkpoint::discover_shards(path);
  State& s = *state_;
  s.path = io::shown_url(path.string());  // for messages: a URL without its credentials
  s.options = options;
  s.index_metadata = index.metadata_json;
  const bool keep_open = index.shards.size() <= kShardsKeptOpen;
  for (std::size_t shard = 0; shard < index.shards.size(); ++shard) {
    auto file = std::make_unique<File>(index.shards[shard], "r", options);
    checkpoint::SafetensorsHeader header = read_header(*file, s.open_reads, s.open_bytes);
    s.shard_names.push_back(file->path());
    s.shard_paths.push_back(index.shards[shard]);
    s.shard_sizes.push_back(file->size());
    s.metadata.push_back(std::move(header.metadata));
    for (checkpoint::HeaderTensor& h : header.tensors) {
      TensorInfo t{std::move(h.name),           h.dtype,         std::move(h.shape),
                   header.data_start + h.begin, h.end - h.begin, shard};
      auto [it, fresh] = s.by_name.emplace(t.name, s.tensors.size());
      if (!fresh) {
        throw CheckpointError(
            file->path(), t.name,
            fmt::format("also in {}", s.shard_names[s.tensors[it->second].shard]));
      }
      s.total += t.nbytes;
      s.tensors.push_back(std::move(t));
    }
    if (keep_open) s.files.push_back(std::move(file));
  }
  check_against_index(index, s.tensors, s.by_name, s.shard_names);
}

void Checkpoint::open_dcp(const fs::path& path, const FileOptions& options) {
  checkpoint::DcpFolder dcp = checkpoint::open_dcp_folder(path, options);
  State& s = *state_;
  s.path = path.string();
  s.options = options;
  s.shard_names = std::move(dcp.shard_names);
  for (const auto& file : dcp.files) {
    s.shard_paths.push_back(file->path());
    s.shard_sizes.push_back(file->size());
  }
  if (dcp.files.size() <= kShardsKeptOpen) s.files = std::move(dcp.files);
  s.metadata.resize(s.shard_names.size());
  s.tensors = std::move(dcp.tensors);
  s.pieces = std::move(dcp.pieces);
  s.skipped = std::move(dcp.byte_items);
  s.open_reads = dcp.open_reads;
  s.open_bytes = dcp.open_bytes;
  for (std::size_t i = 0; i < s.tensors.size(); ++i) {
    s.by_name.emplace(s.tensors[i].name, i);
    s.total += s.tensors[i].nbytes;
  }
}

Checkpoint::~Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;

const std::vector<std::string>& Checkpoint::shards() const { return state_->shard_names; }
const std::vector<TensorInfo>& Checkpoint::tensors() const { return state_->tensors; }
const std::string& Checkpoint::index_metadata_json() const { return state_->index_metadata; }
std::uint64_t Checkpoint::total_bytes() const { return state_->total; }

const std::map<std::string, std::string>& Checkpoint::metadata(std::size_t shard) const {
  if (shard >= state_->metadata.size()) {
    throw Error(fmt::format("checkpoint metadata: shard {} of {}", shard, state_->metadata.size()));
  }
  return state_->metadata[shard];
}

std::size_t Checkpoint::find(std::string_view name) const {
  auto it = state_->by_name.find(std::string(name));
  if (it == state_->by_name.end()) {
    // The names next to it in sorted order: a typo late in a name, or a wrong layer number.
    std::vector<std::string_view> names;
    for (const TensorInfo& t : state_->tensors) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    auto at = std::lower_bound(names.begin(), names.end(), name) - names.begin();
    std::string near;
    for (auto k = std::max<std::ptrdiff_t>(at - 2, 0);
         k < std::min<std::ptrdiff_t>(at + 2, static_cast<std::ptrdiff_t>(names.size())); ++k) {
      near += fmt::format("{}'{}'", near.empty() ? "" : ", ", names[k]);
    }
    throw CheckpointError(state_->path, std::string(name),
                          near.empty() ? "is in no shard of the checkpoint (it holds no tensor)"
                                       : fmt::format("is in no shard of the checkpoint; the "
                                                     "nearest names are {}",
                                                     near));
  }
  return it->second;
}

// The shards' requests of a read_into, submitted at once; past kShardsReadAtOnce, the oldest is
// waited for before the next shard is opened. Declared in this order so that the reads (which
// wait when destroyed) go before the ranges they read into.
struct PendingRead::State {
  const Checkpoint::State* ckpt = nullptr;
  std::chrono::steady_clock::time_point start;
  std::vector<std::vector<ReadRange>> ranges;  // per shard
  std::size_t next_shard = 0;                  // the first shard not yet submitted
  std::uint64_t total = 0;
  LoadReport report;
  struct InFlight {
    std::shared_ptr<File> file;
    checkpoint::GatheredRead read;
  };
  std::deque<InFlight> in_flight;
  bool waited = false;

  // Submits shards' requests while fewer than kShardsReadAtOnce are in flight.
  void submit_more() {
    for (; next_shard < ranges.size() && in_flight.size() < kShardsReadAtOnce; ++next_shard) {
      if (ranges[next_shard].empty()) continue;
      std::shared_ptr<File> file = ckpt->open_shard(next_shard);
      checkpoint::GatheredRead read(*file, ranges[next_shard]);
      in_flight.push_back({std::move(file), std::move(read)});
    }
  }
};

PendingRead::PendingRead(std::unique_ptr<State> state) : state_(std::move(state)) {}
PendingRead::PendingRead(PendingRead&&) noexcept = default;
PendingRead& PendingRead::operator=(PendingRead&&) noexcept = default;
PendingRead::~PendingRead() = default;

LoadReport PendingRead::wait(const ProgressOptions& progress) {
  State& s = *state_;
  if (s.waited) throw Error("checkpoint read: wait() was called before on this read");
  s.waited = true;
  LoadReport& report = s.report;
  checkpoint::ProgressMeter meter(progress, s.total);
  auto landed = [&] {
    std::uint64_t bytes = report.bytes;
    for (const State::InFlight& f : s.in_flight) bytes += f.read.progress();
    return bytes;
  };
  try {
    while (!s.in_flight.empty()) {
      s.in_flight.front().read.wait(meter, landed);
      State::InFlight done = std::move(s.in_flight.front());
      s.in_flight.pop_front();
      report.bytes += done.read.get();
      add_routes(report, done.read);
      s.submit_more();
    }
    meter.finish();
  } catch (...) {
    // Nothing may still write into the caller's buffers once this throws.
    for (State::InFlight& f : s.in_flight) f.read.wait();
    throw;
  }
  report.seconds = checkpoint::seconds_since(s.start);
  return std::move(report);
}

LoadReport Checkpoint::read_into(std::span<const TensorTarget> targets,
                                 const ProgressOptions& progress) const {
  return start_read_into(targets).wait(progress);
}

PendingRead Checkpoint::start_read_into(std::span<const TensorTarget> targets) const {
  const State& s = *state_;
  auto pending = std::make_unique<PendingRead::State>();
  pending->ckpt = &s;
  pending->start = std::chrono::steady_clock::now();
  std::vector<std::vector<ReadRange>>& ranges = pending->ranges;
  ranges.resize(s.shard_names.size());
  pending->report.open_reads = s.open_reads;
  pending->report.open_bytes = s.open_bytes;
  for (const TensorTarget& target : targets) {
    if (target.tensor >= s.tensors.size()) {
      throw Error(
          fmt::format("checkpoint read: tensor index {} of {}", target.tensor, s.tensors.size()));
    }
    const TensorInfo& t = s.tensors[target.tensor];
    ++pending->report.tensors;
    const std::uint64_t length =
        target.length == TensorTarget::kToTheEnd && target.begin <= t.nbytes
            ? t.nbytes - target.begin
            : target.length;
    if (target.begin > t.nbytes || length > t.nbytes - target.begin) {
      throw CheckpointError(
          s.shard_names[t.shard], t.name,
          fmt::format("bytes [{}, +{}) are not inside its {} B", target.begin, length, t.nbytes));
    }
    if (length == 0) continue;  // nothing to read; the buffer may be null
    if (target.buffer == nullptr) {
      throw CheckpointError(s.shard_names[t.shard], t.name, "no buffer to read into");
    }
    for (const checkpoint::TensorPiece& p : s.pieces_of(target.tensor)) {
      const std::uint64_t lo = std::max(p.dest, target.begin);
      const std::uint64_t hi = std::min(p.dest + p.length, target.begin + length);
      if (lo >= hi) continue;
      ranges[p.shard].push_back({p.file_offset + (lo - p.dest), static_cast<std::size_t>(hi - lo),
                                 static_cast<char*>(target.buffer) + (lo - target.begin)});
    }
    pending->total += length;
  }
  pending->submit_more();  // a failure here: the reads already submitted wait when destroyed
  return PendingRead(std::move(pending));
}

LoadResult Checkpoint::load(const LoadOptions& options) const {
  const State& s = *state_;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::size_t> chosen;
  if (options.names.empty()) {
    for (std::size_t i = 0; i < s.tensors.size(); ++i) chosen.push_back(i);
  } else {
    for (const std::string& name : options.names) chosen.push_back(find(name));
    std::sort(chosen.begin(), chosen.end());
    chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
  }
  LoadResult result;
  LoadReport& report = result.report;
  // Into pageable host memory, a mapped shard's tensors are views of its mapping: neither
  // allocated nor read (host_route.h).
  std::vector<int> in_mapping(chosen.size(), -1);
  std::vector<const FileMapping*> to_populate;  // cold shards' mappings, read in below
  std::uint64_t populated = 0;                  // their tensors' bytes
  const Settings settings = settings_with(s.options.settings);
  // A DCP folder's tensors are pieces of torch.save blobs, read into place (not mapped).
  if (options.memory == MemoryKind::kHostPageable && s.pieces.empty()) {
    in_mapping = route_host_shards(options.host_load.value_or(settings.host_load), s.options.direct,
                                   s.tensors, chosen, s.shard_names, s.shard_paths, s.shard_sizes,
                                   result, to_populate);
    for (const HostRoute& r : report.host_routes) {
      (r.path == "populated" ? populated : report.bytes) += r.bytes;
    }
  }
  std::vector<std::uint64_t> offsets;  // in the one allocation
  std::uint64_t packed = 0;
  for (std::size_t k = 0; k < chosen.size(); ++k) {
    offsets.push_back(packed);
    if (in_mapping[k] >= 0) continue;
    packed += (s.tensors[chosen[k]].nbytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  using Clock = std::chrono::steady_clock;
  Clock::duration allocating{};
  std::vector<void*> allocations;
  auto allocate = [&](std::uint64_t bytes) {
    const auto t0 = Clock::now();
    void* data = options.allocate
                     ? options.allocate(bytes)
                     : result.memory.emplace_back(options.memory, bytes, options.device).data();
    allocating += Clock::now() - t0;
    if (data == nullptr && bytes > 0) {
      throw Error(
          fmt::format("checkpoint load {}: the allocator gave no memory for {} B", s.path, bytes));
    }
    allocations.push_back(data);
    return data;
  };
  // Not for views alone: they need no memory (an empty load still makes its one allocation).
  const bool one_allocation = options.one_allocation && (packed > 0 || result.mappings.empty());
  if (one_allocation) allocate(packed);
  // Pageable host memory is allocated before any read: an allocation is an mmap, microseconds
  // alone, but it takes the process's mmap lock, which the workers' faults into fresh pages
  // contend for; interleaved with the reads, a 4 GiB load's 290 allocations took 45 ms instead
  // of 1, and the load ran 4% slower (bench/NOTES.md §27).
  const bool allocate_first = !one_allocation && options.memory == MemoryKind::kHostPageable;
  if (allocate_first) {
    for (std::size_t k = 0; k < chosen.size(); ++k) {
      if (in_mapping[k] < 0) allocate(s.tensors[chosen[k]].nbytes);
    }
  }
  // Otherwise each part's read is submitted as soon as its tensors' memory exists, so that
  // allocating the next part (cuMemAlloc: about 40 us a tensor) overlaps the reads in flight;
  // past kPartsAtOnce parts, the oldest is waited for first (a shard past kShardsKeptOpen is
  // opened for its part: descriptors stay bounded). Declared after `result`: on a failure these,
  // destroyed first, wait for their reads before any buffer is freed.
  struct InFlight {
    std::vector<ReadRange> ranges;  // kept until the part's read is done
    std::shared_ptr<File> file;
    std::size_t shard;
    checkpoint::GatheredRead read;
  };
  std::deque<InFlight> in_flight;
  report.tensors = chosen.size();
  std::uint64_t total = 0;
  for (std::size_t i : chosen) total += s.tensors[i].nbytes;
  checkpoint::ProgressMeter meter(options.progress, total);
  auto landed = [&] {
    std::uint64_t bytes = report.bytes;
    for (const InFlight& f : in_flight) bytes += f.read.progress();
    return bytes;
  };
  auto finish_oldest = [&] {
    in_flight.front().read.wait(meter, landed);
    report.bytes += in_flight.front().read.get();
    add_routes(report, in_flight.front().read);
    in_flight.pop_front();
  };
  std::vector<ReadRange> part;
  std::size_t shard = SIZE_MAX;
  std::uint64_t part_bytes = 0;
  auto submit = [&] {
    if (part.empty()) return;
    if (in_flight.size() == kPartsAtOnce) finish_oldest();
    std::shared_ptr<File> file = s.open_shard(shard);
    // A remote shard's parts run one after another (each keeps every worker busy with its GETs),
    // so that each part's route counts its own GETs: a window on the object shared with another
    // part would count both, and the load report sums the routes.
    if (io::is_remote_url(file->path())) {
      while (!in_flight.empty() && in_flight.back().shard == shard) finish_oldest();
    }
    std::vector<ReadRange> ranges = std::move(part);
    part.clear();
    checkpoint::GatheredRead read(*file, ranges);  // the moved vector keeps its elements' place
    in_flight.push_back({std::move(ranges), std::move(file), shard, std::move(read)});
    meter.report(landed());  // between allocations too, not only while waiting
  };
  std::size_t allocated = 0;  // allocations handed to tensors so far
  for (std::size_t k = 0; k < chosen.size(); ++k) {
    const TensorInfo& t = s.tensors[chosen[k]];
    if (in_mapping[k] >= 0) {
      const FileMapping& m = *result.mappings[in_mapping[k]];
      char* data = static_cast<char*>(m.data()) + (t.file_offset - m.offset());
      result.tensors.push_back({t.name, t.dtype, t.shape, data, t.nbytes, true,
                                static_cast<std::size_t>(in_mapping[k])});
      continue;
    }
    void* data;
    std::size_t memory = 0;
    if (one_allocation) {
      data = static_cast<char*>(allocations.front()) + offsets[k];
    } else {
      memory = allocated++;
      data = allocate_first ? allocations[memory] : allocate(t.nbytes);
    }
    result.tensors.push_back({t.name, t.dtype, t.shape, data, t.nbytes, false, memory});
    for (const checkpoint::TensorPiece& p : s.pieces_of(chosen[k])) {
      if (p.shard != shard || part_bytes >= kPartBytes) {
        submit();
        shard = p.shard;
        part_bytes = 0;
      }
      if (p.length == 0) continue;
      part.push_back(
          {p.file_offset, static_cast<std::size_t>(p.length), static_cast<char*>(data) + p.dest});
      part_bytes += p.length;
    }
  }
  submit();
  if (!to_populate.empty()) {  // while the reads of tensors not viewable in place run
    checkpoint::populate(
        to_populate, settings.host_nthreads, settings.task_size,
        [&](std::uint64_t done) { meter.report(landed() + std::min(done, populated)); });
    report.bytes += populated;
  }
  while (!in_flight.empty()) finish_oldest();
  meter.finish();
  // The allocations are part of what a user waits for.
  report.seconds = checkpoint::seconds_since(start);
  report.allocate_seconds = std::chrono::duration<double>(allocating).count();
  report.skipped = s.skipped;
  report.open_reads = s.open_reads;
  report.open_bytes = s.open_bytes;
  return result;
}

std::string HostRoute::describe() const {
  std::string text = fmt::format("{}: {}: {}", fs::path(file).filename().string(), path, reason);
  if (path == "read") return text;
  text += fmt::format(" ({} tensors, {} B in place", tensors, bytes);
  if (copied > 0) {
    text += fmt::format("; {} read, their offsets not multiples of their dtype's size", copied);
  }
  return text + ")";
}

std::string LoadReport::summary() const {
  const bool remote = std::any_of(routes.begin(), routes.end(),
                                  [](const RouteReport& r) { return r.source.remote; });
  std::string out = fmt::format(
      "{} tensors, {} B in {:.4f} s: {:.2f} GB/s, {} request(s){}", tensors, bytes, seconds,
      seconds > 0 ? bytes / seconds / 1e9 : 0.0, routes.size(),
      remote
          ? fmt::format(", {} GET(s), {} retries, {} new connection(s)", gets, retries, connections)
          : "");
  for (const HostRoute& r : host_routes) out += "\n  " + r.describe();
  if (!routes.empty()) out += "\n" + join_verdicts(routes);
  if (!skipped.empty()) {
    out += fmt::format("\n{} non-tensor item(s) skipped: {}", skipped.size(),
                       fmt::join(skipped, ", "));
  }
  out += fmt::format("\n{} B read for the tensors; opening read {} B in {} read(s)", bytes_read,
                     open_bytes, open_reads);
  return out;
}

std::string LoadReport::to_json() const {
  nlohmann::json routes_json = nlohmann::json::array();
  for (const RouteReport& r : routes) routes_json.push_back(nlohmann::json::parse(r.to_json()));
  nlohmann::json host_json = nlohmann::json::array();
  for (const HostRoute& r : host_routes) {
    host_json.push_back({{"file", r.file},
                         {"path", r.path},
                         {"reason", r.reason},
                         {"page_cache", core::page_cache_json(r.page_cache)},
                         {"tensors", r.tensors},
                         {"bytes", r.bytes},
                         {"copied", r.copied}});
  }
  nlohmann::json out = {{"tensors", tensors},
                        {"bytes", bytes},
                        {"bytes_read", bytes_read},
                        {"open_reads", open_reads},
                        {"open_bytes", open_bytes},
                        {"seconds", seconds},
                        {"allocate_seconds", allocate_seconds},
                        {"gbps", seconds > 0 ? bytes / seconds / 1e9 : 0.0},
                        {"gets", gets},
                        {"retries", retries},
                        {"connections", connections},
                        {"routes", routes_json},
                        {"skipped", skipped},
                        {"host_routes", host_json}};
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ferry
