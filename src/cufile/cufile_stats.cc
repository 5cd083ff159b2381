#include "cufile/cufile_stats.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "cuda/cuda_driver.h"
#include "cufile/cufile_abi.h"
#include "cufile/cufile_driver.h"
#include "platform/nvfs_proc.h"

namespace ferry::cufile {
namespace {

// Requests whose windows are open on one set of counters.
struct Windows {
  long active = 0;
  std::uint64_t begun = 0;
};

// What the driver said of one GPU's UUID, asked once per process.
struct UuidLookup {
  std::optional<std::array<char, 16>> uuid;
  std::string why_not;
  bool from_machine = false;  // the environment's, not the driver's: asked again each time
};

struct StatsState {
  std::mutex mu;
  bool started = false;
  std::string why_not = "the cuFile driver is not open";
  StatsLayout layout = StatsLayout::kUnknown;
  const Library* library = nullptr;
  // Attribution of overlapping requests: every request, those counted on one GPU's entry (by
  // ordinal), and those whose GPU's entry cannot be named (their pieces may be in any entry).
  Windows all;
  std::map<int, Windows> per_gpu;
  Windows unnamed;
  std::map<int, UuidLookup> uuids;
};

StatsState& stats_state() {
  // Process-wide: cuFile's statistics are the process's (one driver, one counter page).
  static StatsState* s = [] {
    auto* made = new StatsState();
    // A thread of the parent may hold the lock at fork(): the child starts with a free one. (`s`
    // is null only in a child forked while it was being made.)
    pthread_atfork(nullptr, nullptr, [] {
      if (s != nullptr) new (&s->mu) std::mutex;
    });
    return made;
  }();
  return *s;
}

// Room for either layout and then some: a newer library writing a longer struct than ferry
// knows must not overwrite memory.
constexpr std::size_t kStatsBufferSize =
    std::max(sizeof(abi::StatsLevel3V1), sizeof(abi::StatsLevel3V2)) + 16384;

template <typename Level3>
StatsSnapshot sum(const Level3& l3) {
  StatsSnapshot out;
  std::uint32_t n = std::min<std::uint32_t>(l3.num_gpus, abi::kMaxGpus);
  out.gpus.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    const abi::PerGpuStats& g = l3.per_gpu_stats[i];
    GpuPieceCounters& e = out.gpus.emplace_back();
    std::memcpy(e.uuid.data(), g.uuid, e.uuid.size());
    e.reads = {g.n_total_reads, g.n_nvfs_reads, g.n_posix_reads, g.n_p2p_reads};
    e.writes = {g.n_total_writes, g.n_nvfs_writes, g.n_posix_writes, g.n_p2p_writes};
    for (auto [to, from] : {std::pair{&out.reads, &e.reads}, std::pair{&out.writes, &e.writes}}) {
      to->total += from->total;
      to->nvfs += from->nvfs;
      to->posix += from->posix;
      to->p2p += from->p2p;
    }
  }
  return out;
}

// GPU `device`'s UUID: the machine's where it names one, else the driver's. Under s.mu.
const UuidLookup& uuid_of(StatsState& s, int device, const Machine& machine) {
  auto [it, added] = s.uuids.try_emplace(device);
  UuidLookup& u = it->second;
  if (std::optional<std::array<char, 16>> named =
          machine.gpu_uuid ? machine.gpu_uuid(device) : std::nullopt) {
    u = {named, {}, true};
    return u;
  }
  if (!added && !u.from_machine) return u;
  u = {};
  std::string why;
  const cuda::Driver* d = cuda::driver_or_null(&why);
  if (d == nullptr) {
    u.why_not = why;
    return u;
  }
  cuda::abi::Device dev = 0;
  cuda::abi::Uuid uuid{};
  cuda::abi::Result r = d->DeviceGet(&dev, device);
  if (r == cuda::abi::kSuccess) r = d->DeviceGetUuid(&uuid, dev);
  if (r != cuda::abi::kSuccess) {
    u.why_not = cuda::describe(r, "cuDeviceGetUuid");
    return u;
  }
  u.uuid.emplace();
  std::memcpy(u.uuid->data(), uuid.bytes, u.uuid->size());
  return u;
}

// Reads the counters; empty with `why` set when cuFile refuses.
std::optional<StatsSnapshot> read_stats(const Library& lib, StatsLayout layout, std::string* why) {
  std::vector<std::uint64_t> buffer(kStatsBufferSize / sizeof(std::uint64_t), 0);
  abi::Error e = lib.GetStatsL3(buffer.data());
  if (e.err != abi::kSuccess) {
    *why = "cuFileGetStatsL3 failed: " + describe(e);
    return std::nullopt;
  }
  return sum_per_gpu(buffer.data(), layout);
}

PieceCounters minus(const PieceCounters& a, const PieceCounters& b) {
  auto d = [](std::uint64_t x, std::uint64_t y) { return x >= y ? x - y : 0; };
  return {d(a.total, b.total), d(a.nvfs, b.nvfs), d(a.posix, b.posix), d(a.p2p, b.p2p)};
}

bool env_true(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  std::string s(v);
  return s == "true" || s == "1" || s == "TRUE" || s == "True" || s == "yes";
}

// Why cuFile used its compatibility path, in words.
std::string compat_reason(const std::filesystem::path& root) {
  if (env_true("CUFILE_FORCE_COMPAT_MODE")) return "CUFILE_FORCE_COMPAT_MODE=true forces it";
  std::string nvfs = nvfs_module_missing(root);
  if (!nvfs.empty()) return "the nvidia-fs module is not loaded";
  return "cuFile chose it for this file, buffer or topology (its cufile.log says why)";
}

}  // namespace

StatsLayout stats_layout(int version) {
  if (version >= 1140 && version < 1190) return StatsLayout::kV1;
  if (version >= 1190 && version < 1200) return StatsLayout::kV2;
  return StatsLayout::kUnknown;
}

std::string version_text(int version) {
  if (version <= 0) return "unknown";
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

StatsSnapshot sum_per_gpu(const void* level3, StatsLayout layout) {
  if (layout == StatsLayout::kV2) return sum(*static_cast<const abi::StatsLevel3V2*>(level3));
  return sum(*static_cast<const abi::StatsLevel3V1*>(level3));
}

void start_stats(const Library& lib) {
  StatsState& s = stats_state();
  std::lock_guard lock(s.mu);
  if (s.started) return;
  std::string why;
  int v = version(&why);
  s.layout = stats_layout(v);
  if (lib.GetStatsL3 == nullptr || lib.SetStatsLevel == nullptr || lib.StatsStart == nullptr) {
    s.why_not = fmt::format(
        "{} lacks the statistics API (cuFileSetStatsLevel, cuFileStatsStart, "
        "cuFileGetStatsL3)",
        lib.path);
    return;
  }
  if (v == 0) {
    s.why_not = fmt::format(
        "cuFile's version is unknown ({}), so is its statistics layout; "
        "not read",
        why);
    return;
  }
  if (s.layout == StatsLayout::kUnknown) {
    s.why_not = fmt::format(
        "cuFile {} ({}): its statistics layout is unknown to this build of ferry (known: 1.14 "
        "to 1.19); not read",
        version_text(v), v);
    return;
  }
  abi::Error e = lib.SetStatsLevel(3);
  if (e.err == abi::kSuccess) e = lib.StatsStart();
  if (e.err != abi::kSuccess) {
    s.why_not = "cuFileSetStatsLevel(3)/cuFileStatsStart failed: " + describe(e);
    return;
  }
  s.library = &lib;
  s.started = true;
  s.why_not.clear();
}

std::string stats_unavailable() {
  StatsState& s = stats_state();
  std::lock_guard lock(s.mu);
  return s.why_not;
}

const GpuPieceCounters* StatsSnapshot::find(const std::array<char, 16>& uuid) const {
  for (const GpuPieceCounters& g : gpus) {
    if (g.uuid == uuid) return &g;
  }
  return nullptr;
}

struct Observation::Impl {
  Op op;
  int device = -1;
  std::optional<std::array<char, 16>> uuid;  // set: counted on that GPU's entry where found
  std::string unnamed_why;                   // why not, when not set
  const Library* library = nullptr;
  StatsLayout layout = StatsLayout::kUnknown;
  std::string why_not;
  bool shared_all = false;  // another request overlapped (any GPU)
  bool shared_gpu = false;  // another on this GPU, or one counted on no entry, overlapped
  std::uint64_t seq_all = 0;
  std::uint64_t seq_gpu = 0;
  std::uint64_t seq_unnamed = 0;
  std::optional<StatsSnapshot> before;
  std::filesystem::path root;  // the machine's (cufile/cufile_machine.h)
  bool nvfs_loaded = false;
  platform::NvfsSnapshot nvfs_before;
  bool counted = true;  // still in StatsState's windows
};

namespace {

// Under s.mu: the request leaves the windows it entered; notes whether others began meanwhile.
void leave(StatsState& s, Observation::Impl& m) {
  if (!m.counted) return;
  m.counted = false;
  if (s.all.begun != m.seq_all) m.shared_all = true;
  --s.all.active;
  if (m.uuid) {
    Windows& w = s.per_gpu[m.device];
    if (w.begun != m.seq_gpu || s.unnamed.begun != m.seq_unnamed) m.shared_gpu = true;
    --w.active;
  } else {
    --s.unnamed.active;
  }
}

PieceCounters of(const GpuPieceCounters* g, Op op) {
  if (g == nullptr) return {};
  return op == Op::kRead ? g->reads : g->writes;
}

}  // namespace

std::unique_ptr<Observation> Observation::begin(Op op, int device, const Machine& machine) {
  std::unique_ptr<Observation> o(new Observation());
  o->impl_ = std::make_unique<Impl>();
  Impl& m = *o->impl_;
  m.op = op;
  m.device = device;
  m.root = machine.root;
  StatsState& s = stats_state();
  {
    std::lock_guard lock(s.mu);
    if (device >= 0) {
      const UuidLookup& u = uuid_of(s, device, machine);
      m.uuid = u.uuid;
      if (!m.uuid) m.unnamed_why = fmt::format("GPU {}'s UUID is not known: {}", device, u.why_not);
    } else {
      m.unnamed_why = "the request's GPU is not known";
    }
    m.shared_all = s.all.active > 0;
    ++s.all.active;
    m.seq_all = ++s.all.begun;
    if (m.uuid) {
      Windows& w = s.per_gpu[device];
      m.shared_gpu = w.active > 0 || s.unnamed.active > 0;
      ++w.active;
      m.seq_gpu = ++w.begun;
      m.seq_unnamed = s.unnamed.begun;
    } else {
      ++s.unnamed.active;
      ++s.unnamed.begun;
    }
    m.library = s.started ? s.library : nullptr;
    m.layout = s.layout;
    m.why_not = s.why_not;
  }
  if (m.library != nullptr) m.before = read_stats(*m.library, m.layout, &m.why_not);
  m.nvfs_loaded = nvfs_module_missing(m.root).empty();
  if (m.nvfs_loaded) m.nvfs_before = platform::read_nvfs(m.root);
  return o;
}

Observation::~Observation() {
  StatsState& s = stats_state();
  std::lock_guard lock(s.mu);
  leave(s, *impl_);
}

void Observation::end(CufileCounts& out) {
  Impl& m = *impl_;
  out.version = version();
  std::optional<StatsSnapshot> after;
  if (m.before) after = read_stats(*m.library, m.layout, &m.why_not);
  {
    StatsState& s = stats_state();
    std::lock_guard lock(s.mu);
    leave(s, m);
  }
  if (m.nvfs_loaded) {
    NvfsCountersDelta d = platform::delta(platform::read_nvfs(m.root), m.nvfs_before);
    out.module_observable = d.known;
    out.module_why_not = d.reason;
    out.module_ops = m.op == Op::kRead ? d.reads.n : d.writes.n;
  } else {
    out.module_observable = false;
    out.module_why_not = "the nvidia-fs module is not loaded";
  }
  if (!after) {
    out.observable = false;
    out.why_not = m.why_not;
    return;
  }
  // The GPU's own entry where cuFile has one of its UUID (a GPU cuFile had not served before
  // the request may have had none then: it counted from zero).
  const GpuPieceCounters* entry = m.uuid ? after->find(*m.uuid) : nullptr;
  PieceCounters d;
  if (entry != nullptr) {
    d = minus(of(entry, m.op), of(m.before->find(*m.uuid), m.op));
    out.shared_window = m.shared_gpu;
    out.gpu_entry = m.device;
    out.counted_over =
        fmt::format("GPU {}'s entry of cuFile's per-GPU counters (by UUID)", m.device);
  } else {
    d = m.op == Op::kRead ? minus(after->reads, m.before->reads)
                          : minus(after->writes, m.before->writes);
    out.shared_window = m.shared_all;
    out.gpu_entry = -1;
    const std::string why =
        m.uuid ? fmt::format("none of cuFile's {} per-GPU entries has GPU {}'s UUID",
                             after->gpus.size(), m.device)
               : m.unnamed_why;
    out.counted_over = fmt::format("every GPU's entry of cuFile's counters, summed ({})", why);
  }
  out.observable = true;
  out.why_not.clear();
  out.nvfs = d.nvfs;
  out.posix = d.posix;
  out.p2p = d.p2p;
  if (d.posix > 0) out.compat_why = compat_reason(m.root);
}

}  // namespace ferry::cufile
