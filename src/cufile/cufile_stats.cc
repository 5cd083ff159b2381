#include "cufile/cufile_stats.h"

#include <fmt/format.h>
#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <vector>

#include "cufile/cufile_abi.h"
#include "cufile/cufile_driver.h"
#include "cufile/cufile_testing.h"
#include "platform/nvfs_proc.h"

namespace ferry::cufile {
namespace {

struct StatsState {
  std::mutex mu;
  bool started = false;
  std::string why_not = "the cuFile driver is not open";
  StatsLayout layout = StatsLayout::kUnknown;
  const Library* library = nullptr;
  // Attribution of overlapping requests.
  long active = 0;
  std::uint64_t begun = 0;
};

StatsState* stats_instance = nullptr;

StatsState& stats_state() {
  static StatsState* s = [] {
    stats_instance = new StatsState();
    // A thread of the parent may hold the lock at fork(): the child starts with a free one.
    pthread_atfork(nullptr, nullptr, [] { new (&stats_instance->mu) std::mutex; });
    return stats_instance;
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
  for (std::uint32_t i = 0; i < n; ++i) {
    const abi::PerGpuStats& g = l3.per_gpu_stats[i];
    out.reads.total += g.n_total_reads;
    out.reads.nvfs += g.n_nvfs_reads;
    out.reads.posix += g.n_posix_reads;
    out.reads.p2p += g.n_p2p_reads;
    out.writes.total += g.n_total_writes;
    out.writes.nvfs += g.n_nvfs_writes;
    out.writes.posix += g.n_posix_writes;
    out.writes.p2p += g.n_p2p_writes;
  }
  return out;
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

PathCounts minus(const PathCounts& a, const PathCounts& b) {
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
std::string compat_reason() {
  if (env_true("CUFILE_FORCE_COMPAT_MODE")) return "CUFILE_FORCE_COMPAT_MODE=true forces it";
  std::string nvfs = nvfs_module_missing();
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

struct Observation::Impl {
  Op op;
  const Library* library = nullptr;
  StatsLayout layout = StatsLayout::kUnknown;
  std::string why_not;
  bool shared = false;
  std::uint64_t seq = 0;
  std::optional<StatsSnapshot> before;
  bool nvfs_loaded = false;
  platform::NvfsSnapshot nvfs_before;
  bool counted = true;  // still in StatsState::active
};

std::unique_ptr<Observation> Observation::begin(Op op) {
  std::unique_ptr<Observation> o(new Observation());
  o->impl_ = std::make_unique<Impl>();
  Impl& m = *o->impl_;
  m.op = op;
  StatsState& s = stats_state();
  {
    std::lock_guard lock(s.mu);
    m.shared = s.active > 0;
    ++s.active;
    m.seq = ++s.begun;
    m.library = s.started ? s.library : nullptr;
    m.layout = s.layout;
    m.why_not = s.why_not;
  }
  if (m.library != nullptr) m.before = read_stats(*m.library, m.layout, &m.why_not);
  m.nvfs_loaded = nvfs_module_missing().empty();
  if (m.nvfs_loaded) m.nvfs_before = platform::read_nvfs(testing::root());
  return o;
}

Observation::~Observation() {
  if (impl_->counted) {
    StatsState& s = stats_state();
    std::lock_guard lock(s.mu);
    --s.active;
  }
}

void Observation::end(CufileCounts& out) {
  Impl& m = *impl_;
  out.version = version();
  std::optional<StatsSnapshot> after;
  if (m.before) after = read_stats(*m.library, m.layout, &m.why_not);
  {
    StatsState& s = stats_state();
    std::lock_guard lock(s.mu);
    // Another request began after this one: it shared the window. One that began before this
    // one was seen as `active` at begin().
    if (s.begun != m.seq) m.shared = true;
    --s.active;
    m.counted = false;
  }
  if (m.nvfs_loaded) {
    platform::NvfsDelta d = platform::delta(platform::read_nvfs(testing::root()), m.nvfs_before);
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
  PathCounts d = m.op == Op::kRead ? minus(after->reads, m.before->reads)
                                   : minus(after->writes, m.before->writes);
  out.observable = true;
  out.why_not.clear();
  out.shared_window = m.shared;
  out.nvfs = d.nvfs;
  out.posix = d.posix;
  out.p2p = d.p2p;
  if (d.posix > 0) out.compat_why = compat_reason();
}

}  // namespace ferry::cufile
