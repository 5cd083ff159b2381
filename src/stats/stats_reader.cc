// Reading other processes' segments (docs/stats.md): finding them (for one pid, the segment of the
// uid it runs as first), refusing any file that is not a regular 0600 file owned by the uid its
// name says, or whose pid runs as another uid (a forgery, unless its process exited before the
// pid's present process started: stale), telling live owners from dead ones (a pid that no longer
// exists, a zombie, or a pid reused by a process of another start time), and removing the
// segments of dead ones. A segment kept mid-update costs a reader a few milliseconds at most, and
// a listing 50 ms in all.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/fd.h"
#include "ferry/route.h"
#include "ferry/stats.h"
#include "stats/stats_layout.h"
#include "stats/stats_publish.h"
#include "stats/stats_segment.h"

namespace ferry {
namespace {

namespace L = statistics::stats_layout;
using Kind = StatsError::Kind;
using State = ProcessEntry::State;

constexpr std::size_t kReasonCodes = L::kReasonCodeCount;

using base::Fd;

class FileSource : public statistics::SegmentSource {
 public:
  explicit FileSource(int fd) : fd_(fd) {}
  std::uint64_t size() override {
    struct stat st {};
    return ::fstat(fd_, &st) == 0 && st.st_size > 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
  }
  bool read(std::uint64_t offset, std::size_t count, std::uint64_t* out) override {
    char* p = reinterpret_cast<char*>(out);
    std::size_t left = count * 8;
    while (left > 0) {
      const ssize_t n = ::pread(fd_, p, left, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      p += n;
      left -= static_cast<std::size_t>(n);
      offset += static_cast<std::uint64_t>(n);
    }
    return true;
  }

 private:
  int fd_;
};

// A segment of this user's own process, read through a read-only shared mapping. Through pread a
// slot's consistent copy takes three system calls (a microsecond or more), longer than the gap
// between two updates of a thread that reads 4 KiB from the page cache back to back (three updates
// a request): such a reader never found a slot between updates, and `ferry stats -p` of a busy
// process failed "busy" after 2,000 attempts in 4 ms. Loads from the mapping take nanoseconds.
// Only this user's segments are mapped: ferry never shortens a live segment (it is allocated whole
// before it is linked under its name), and a process of the same user that shortened it to make
// the reader fault could as well kill it. Another user's segment (read by root) is still copied
// with pread.
class MappedSource : public statistics::SegmentSource {
 public:
  // Nullptr where the file is not this user's, is not of a segment's size, or cannot be mapped.
  static std::unique_ptr<MappedSource> map(int fd, const struct stat& st) {
    if (st.st_uid != ::geteuid() || !S_ISREG(st.st_mode) ||
        static_cast<std::uint64_t>(st.st_size) != L::kSegmentBytes) {
      return nullptr;
    }
    void* p = ::mmap(nullptr, L::kSegmentBytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return nullptr;
    return std::unique_ptr<MappedSource>(new MappedSource(p));
  }
  ~MappedSource() override { ::munmap(base_, L::kSegmentBytes); }
  MappedSource(const MappedSource&) = delete;
  MappedSource& operator=(const MappedSource&) = delete;

  std::uint64_t size() override { return L::kSegmentBytes; }
  // Each word loaded whole, then an acquire fence: the loads of one call come before those of the
  // next, as the system calls of FileSource ordered them (the seqlock's look, copy, look again).
  bool read(std::uint64_t offset, std::size_t count, std::uint64_t* out) override {
    if (offset % 8 != 0 || offset > L::kSegmentBytes || count > (L::kSegmentBytes - offset) / 8) {
      return false;
    }
    const auto* words =
        reinterpret_cast<const std::atomic<std::uint64_t>*>(static_cast<char*>(base_) + offset);
    for (std::size_t i = 0; i < count; ++i) out[i] = words[i].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    return true;
  }

 private:
  explicit MappedSource(void* base) : base_(base) {}
  void* base_;
};

std::string mode_text(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

// Is process `pid` (whose segment says it started at `start_ticks`, 0 when unknown) alive?
bool owner_alive(int pid, std::uint64_t start_ticks, std::string* why_dead) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) {
    *why_dead = "process " + std::to_string(pid) + " has exited";
    return false;
  }
  char state = '?';
  const std::uint64_t now = statistics::read_start_ticks(pid, &state);
  if (state == 'Z' || state == 'X') {
    *why_dead = "process " + std::to_string(pid) + " has exited (a zombie not yet reaped)";
    return false;
  }
  if (start_ticks != 0 && now != 0 && now != start_ticks) {
    *why_dead = "process " + std::to_string(pid) +
                " has exited (its pid now belongs to a process started later)";
    return false;
  }
  return true;
}

// The effective uid that process `pid` runs as (the second field of /proc/PID/status's Uid:
// line); nullopt when it cannot be read.
std::optional<std::uint32_t> process_uid(int pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/status";
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.fd < 0) return std::nullopt;
  char buf[4096];
  std::size_t have = 0;
  for (;;) {
    const ssize_t n = ::read(fd.fd, buf + have, sizeof buf - 1 - have);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    have += static_cast<std::size_t>(n);
    if (have == sizeof buf - 1) break;
  }
  buf[have] = '\0';
  const char* line = std::strstr(buf, "\nUid:");
  if (line == nullptr) return std::nullopt;
  unsigned long real = 0, effective = 0;
  if (std::sscanf(line + 5, "%lu %lu", &real, &effective) != 2) return std::nullopt;
  return static_cast<std::uint32_t>(effective);
}

// The start time (clock ticks since boot) that the segment open on `fd` records for its process:
// 0 unless its header is of this layout and names `pid` and `uid`, as the file's name does.
std::uint64_t recorded_start_ticks(int fd, int pid, std::uint32_t uid) {
  FileSource source(fd);
  std::array<std::uint64_t, L::kPageWords> h{};
  if (source.size() < L::kSegmentBytes || !source.read(0, L::kPageWords, h.data()) ||
      h[L::kHMagic] != L::kMagic || h[L::kHVersion] != L::kVersion ||
      h[L::kHPid] != static_cast<std::uint64_t>(pid) || h[L::kHUid] != uid) {
    return 0;
  }
  return h[L::kHStartTicks];
}

// Is the segment of uid `uid` open on `fd`, named for `pid`, which now runs as `runs_as` (another
// uid), one left by an exited process whose pid was then reused? Its publisher recorded its own
// start time; a process that started before the one now holding the pid is gone (one pid holds
// one process at a time), so the segment is stale, and `why_dead` says so. A segment made while
// that process runs, under its pid (a forgery), records no such earlier start, unless its maker
// wrote one: then it is removed as stale, which is harmless (it is never shown as the process's
// counters either way, and only its owner or root removes it). Equal start times are that very
// process, which changed its uid after it began publishing: never stale.
bool left_before_pid_reuse(int fd, int pid, std::uint32_t uid, std::uint32_t runs_as,
                           std::string* why_dead) {
  const std::uint64_t recorded = recorded_start_ticks(fd, pid, uid);
  const std::uint64_t now = statistics::read_start_ticks(pid, nullptr);
  if (recorded == 0 || now == 0 || recorded >= now) return false;
  *why_dead = "process " + std::to_string(pid) + " of uid " + std::to_string(uid) +
              " has exited (its pid now belongs to a process of uid " + std::to_string(runs_as) +
              " started later)";
  return true;
}

// How long reading segments that stay mid-update may take, counted from the writer's last
// move. Issue 30: 2,000 attempts took 1.15 s per segment, and 21 such segments made `--all` take
// 24 s. But a healthy writer preempted inside an update on a loaded machine stays mid-update for
// a scheduler slice or more (5 ms made a reader under ThreadSanitizer on 2 cores give up on a
// busy, live process): one process asked for waits up to kOneSegment; a listing gives each
// segment at most kPerSegment and all of them kPerListing, then a busy segment gets one look.
constexpr std::chrono::milliseconds kOneSegment{200};
constexpr std::chrono::milliseconds kPerSegment{20};
constexpr std::chrono::milliseconds kPerListing{100};

struct BusyBudget {
  std::chrono::milliseconds per_segment;
  std::chrono::steady_clock::time_point deadline;
  static BusyBudget one() { return {kOneSegment, std::chrono::steady_clock::now() + kOneSegment}; }
  static BusyBudget listing() {
    return {kPerSegment, std::chrono::steady_clock::now() + kPerListing};
  }
  statistics::ReadPolicy next() const {
    statistics::ReadPolicy policy;
    const auto left = deadline - std::chrono::steady_clock::now();
    const auto budget = std::min<std::chrono::nanoseconds>(
        per_segment, std::max<std::chrono::nanoseconds>(left, std::chrono::nanoseconds(0)));
    if (budget.count() == 0) {
      policy.attempts = 2;
      return policy;
    }
    policy.budget_ns = static_cast<std::uint64_t>(budget.count());
    policy.pause = [](int attempt) {
      if (attempt < 50) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    };
    return policy;
  }
};

std::string comm_of(const std::array<std::uint64_t, L::kPageWords>& h) {
  char raw[L::kCommWords * 8 + 1] = {};
  std::memcpy(raw, &h[L::kHComm], L::kCommWords * 8);
  std::string out;
  for (std::size_t i = 0; i < L::kCommWords * 8 && raw[i] != '\0'; ++i) {
    const unsigned char c = static_cast<unsigned char>(raw[i]);
    out += c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?';
  }
  return out;
}

RouteCounters route_counters(const statistics::SlotSum& t, std::size_t bucket, std::size_t route) {
  RouteCounters c;
  c.reads = t[L::route_word(bucket, route, L::kReads)];
  c.writes = t[L::route_word(bucket, route, L::kWrites)];
  c.failed = t[L::route_word(bucket, route, L::kFailed)];
  c.bytes_read = t[L::route_word(bucket, route, L::kBytesRead)];
  c.bytes_written = t[L::route_word(bucket, route, L::kBytesWritten)];
  c.tasks = t[L::route_word(bucket, route, L::kTasks)];
  return c;
}

void add_into(RouteCounters& to, const RouteCounters& c) {
  to.reads += c.reads;
  to.writes += c.writes;
  to.failed += c.failed;
  to.bytes_read += c.bytes_read;
  to.bytes_written += c.bytes_written;
  to.tasks += c.tasks;
}

std::string memory_name(std::size_t bucket) {
  if (bucket == L::kHostBucket) return "host";
  if (bucket == L::kOtherGpuBucket) return "gpu " + std::to_string(L::kMaxGpus) + "+";
  if (bucket == L::kUnrecordedBucket) return "not recorded";
  return "gpu " + std::to_string(bucket - 1);
}

int memory_device(std::size_t bucket) {
  if (bucket == L::kHostBucket) return MemoryCounters::kHost;
  if (bucket == L::kOtherGpuBucket) return MemoryCounters::kHigherGpu;
  if (bucket == L::kUnrecordedBucket) return MemoryCounters::kUnrecorded;
  return static_cast<int>(bucket - 1);
}

ProcessStats to_process_stats(const statistics::SegmentRead& r, const std::string& path) {
  const auto& h = r.header;
  const statistics::SlotSum& t = r.sum;
  ProcessStats p;
  p.pid = static_cast<int>(h[L::kHPid]);
  p.uid = static_cast<std::uint32_t>(h[L::kHUid]);
  p.command = comm_of(h);
  p.path = path;
  p.layout_version = h[L::kHVersion];
  const std::uint64_t v = h[L::kHFerryVersion];
  p.ferry_version = std::to_string((v >> 32) & 0xffffffff) + "." +
                    std::to_string((v >> 16) & 0xffff) + "." + std::to_string(v & 0xffff);
  p.process_started = static_cast<double>(h[L::kHProcessStartedNs]) / 1e9;
  p.counting_since = static_cast<double>(h[L::kHCountingSinceNs]) / 1e9;
  p.read_at = static_cast<double>(statistics::unix_now_ns()) / 1e9;
  p.totals = statistics::stats_from_sum(t);
  PathCounters* paths[] = {&p.posix, &p.cufile};
  for (std::size_t b = 0; b < L::kBuckets; ++b) {
    MemoryCounters m;
    m.device = memory_device(b);
    m.name = memory_name(b);
    m.posix = route_counters(t, b, 0);
    m.cufile = route_counters(t, b, 1);
    m.nvfs_pieces = t[L::bucket_word(b, L::kNvfs)];
    m.compat_pieces = t[L::bucket_word(b, L::kCompat)];
    m.p2p_pieces = t[L::bucket_word(b, L::kP2p)];
    m.shared_windows = t[L::bucket_word(b, L::kSharedWindows)];
    add_into(p.posix.counts, m.posix);
    add_into(p.cufile.counts, m.cufile);
    if (m.posix.requests() + m.cufile.requests() + m.posix.tasks + m.cufile.tasks + m.nvfs_pieces +
            m.compat_pieces + m.p2p_pieces !=
        0) {
      p.memories.push_back(std::move(m));
    }
  }
  for (std::size_t route = 0; route < L::kRoutes; ++route) {
    PathCounters& pc = *paths[route];
    for (std::size_t c = 0; c < kReasonCodes; ++c) {
      const std::uint64_t n = t[L::reason_word(route, c)];
      if (n != 0) pc.reasons[to_string(static_cast<ReasonCode>(c))] = n;
    }
    for (std::size_t b = 0; b < L::kHistBuckets; ++b) {
      pc.read_latency.counts[b] = t[L::hist_word(route, 0, b)];
      pc.write_latency.counts[b] = t[L::hist_word(route, 1, b)];
    }
    pc.read_seconds = static_cast<double>(t[L::op_ns_word(route, 0)]) / 1e9;
    pc.write_seconds = static_cast<double>(t[L::op_ns_word(route, 1)]) / 1e9;
  }
  p.direct_tasks = t[L::kSlotDirectTasks];
  p.inflight_known = (h[L::kHFlags] & L::kFlagInflightFed) != 0;
  const std::uint64_t started = t[L::kSlotStartedRequests], ended = t[L::kSlotEndedRequests];
  const std::uint64_t sb = t[L::kSlotStartedBytes], eb = t[L::kSlotEndedBytes];
  // Slots are read one after another: an end may be seen without its start. Never below zero.
  p.inflight_requests = started > ended ? started - ended : 0;
  p.inflight_bytes = sb > eb ? sb - eb : 0;
  return p;
}

// What one directory entry holds.
struct Inspection {
  State state = State::kReadable;
  std::string detail;
  std::optional<ProcessStats> stats;
  bool removed = false;
  bool exited = false;
};

// Removes `name` if it is still the file `st` describes and this user may.
bool remove_segment(int dirfd, const std::string& name, const struct stat& st) {
  if (::geteuid() != 0 && st.st_uid != ::geteuid()) return false;
  struct stat now {};
  if (::fstatat(dirfd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0) return false;
  if (now.st_dev != st.st_dev || now.st_ino != st.st_ino) return false;
  return ::unlinkat(dirfd, name.c_str(), 0) == 0;
}

Inspection inspect(int dirfd, const std::string& dir, const std::string& name, std::uint32_t uid,
                   int pid, const BusyBudget& busy) {
  Inspection out;
  const std::string path = dir + "/" + name;
  Fd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.fd < 0) {
    const int e = errno;
    if (e == EACCES || e == EPERM) {
      out.state = State::kPermissionDenied;
      out.detail = "permission denied: " + path + " belongs to uid " + std::to_string(uid) +
                   " and is readable by its owner only";
      std::string why_dead;
      if (!owner_alive(pid, 0, &why_dead)) {
        out.state = State::kStale;
        out.exited = true;
        out.detail = why_dead + "; its segment " + path + " belongs to uid " + std::to_string(uid) +
                     ", who (or root) can remove it";
      }
    } else if (e == ELOOP) {
      out.state = State::kCorrupt;
      out.detail = path + " is a symbolic link, not a segment: refusing it";
    } else if (e == ENOENT) {
      out.state = State::kRemoved;  // gone between listing and opening
      out.detail = path + " was removed meanwhile";
    } else {
      out.state = State::kCorrupt;
      out.detail = "cannot open " + path + ": " + std::strerror(e);
    }
    return out;
  }
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) {
    out.state = State::kCorrupt;
    out.detail = "cannot stat " + path + ": " + std::strerror(errno);
    return out;
  }
  std::string refuse;
  if (!S_ISREG(st.st_mode)) {
    refuse = path + " is not a regular file: refusing it";
  } else if ((st.st_mode & 07777) != 0600) {
    refuse = path + " has mode " + mode_text(st.st_mode) +
             ", not 0600 (readable by its owner only): refusing it";
  } else if (st.st_uid != uid) {
    refuse = path + " is owned by uid " + std::to_string(st.st_uid) + ", not uid " +
             std::to_string(uid) + " as its name says: refusing it";
  } else if (::geteuid() != 0 && st.st_uid != ::geteuid()) {
    out.state = State::kPermissionDenied;
    out.detail = "permission denied: " + path + " belongs to uid " + std::to_string(uid) +
                 " and is readable by its owner only";
    return out;
  } else if (const std::optional<std::uint32_t> runs_as = process_uid(pid);
             runs_as && *runs_as != uid) {
    // Any user may make a file under any pid's name in a sticky world-writable folder: the
    // owner matching the name proves only who made it. The process must run as that user,
    // unless the segment is an exited process's and its pid was reused since (issue 45, B13).
    std::string why_dead;
    if (left_before_pid_reuse(fd.fd, pid, uid, *runs_as, &why_dead)) {
      out.exited = true;
      out.removed = remove_segment(dirfd, name, st);
      out.state = out.removed ? State::kRemoved : State::kStale;
      out.detail = why_dead + "; its segment " + path +
                   (out.removed ? " was removed" : " could not be removed by this user");
      return out;
    }
    refuse = "forged: process " + std::to_string(pid) + " runs as uid " + std::to_string(*runs_as) +
             ", and " + path + " was made by uid " + std::to_string(uid) + ": ignoring it";
  }
  statistics::SegmentRead read;
  if (refuse.empty()) {
    std::unique_ptr<statistics::SegmentSource> source = MappedSource::map(fd.fd, st);
    if (source == nullptr) source = std::make_unique<FileSource>(fd.fd);
    read = statistics::read_segment(*source, busy.next());
    if (read.problem == statistics::SegmentProblem::kNone &&
        (read.header[L::kHPid] != static_cast<std::uint64_t>(pid) ||
         read.header[L::kHUid] != uid)) {
      read.problem = statistics::SegmentProblem::kLayout;
      read.message = "corrupt header: it names pid " + std::to_string(read.header[L::kHPid]) +
                     " and uid " + std::to_string(read.header[L::kHUid]) + ", its file name pid " +
                     std::to_string(pid) + " and uid " + std::to_string(uid);
    }
  }
  const bool valid = refuse.empty() && read.problem == statistics::SegmentProblem::kNone;
  std::string why_dead;
  const bool alive = owner_alive(pid, valid ? read.header[L::kHStartTicks] : 0, &why_dead);
  if (!alive) {
    out.exited = true;
    out.removed = remove_segment(dirfd, name, st);
  }
  if (!valid) {
    out.state = read.problem == statistics::SegmentProblem::kBusy ? State::kBusy : State::kCorrupt;
    out.detail = !refuse.empty() ? refuse : path + ": " + read.message;
  } else {
    out.stats = to_process_stats(read, path);
    out.stats->exited = !alive;
  }
  if (!alive) {
    if (out.removed) {
      out.state = State::kRemoved;
      out.detail = why_dead + "; its segment " + path + " was removed" +
                   (valid ? "" : " (" + out.detail + ")");
    } else {
      out.state = State::kStale;
      out.detail = why_dead + "; its segment " + path + " could not be removed by this user";
    }
  }
  return out;
}

Fd open_directory(const std::string& dir, int pid) {
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd < 0) {
    throw StatsError(Kind::kUnavailable, pid,
                     "cannot read the stats directory " + dir + ": " + std::strerror(errno));
  }
  return d;
}

struct Named {
  std::string name;
  std::uint32_t uid;
  int pid;
};

std::vector<Named> segment_names(int dirfd) {
  std::vector<Named> out;
  const int copy = ::dup(dirfd);
  if (copy < 0) return out;
  DIR* d = ::fdopendir(copy);
  if (d == nullptr) {
    ::close(copy);
    return out;
  }
  while (dirent* e = ::readdir(d)) {
    Named n{e->d_name, 0, 0};
    if (statistics::parse_segment_name(n.name, &n.uid, &n.pid)) out.push_back(std::move(n));
  }
  ::closedir(d);
  return out;
}

}  // namespace

StatsError::StatsError(Kind kind, int pid, const std::string& message)
    : Error(message), kind_(kind), pid_(pid) {}

std::string to_string(StatsError::Kind kind) {
  switch (kind) {
    case Kind::kNoProcess:
      return "no_process";
    case Kind::kNotPublished:
      return "not_published";
    case Kind::kPermissionDenied:
      return "permission_denied";
    case Kind::kCorrupt:
      return "corrupt";
    case Kind::kBusy:
      return "busy";
    case Kind::kUnavailable:
      return "unavailable";
  }
  return "?";
}

std::string to_string(ProcessEntry::State state) {
  switch (state) {
    case State::kReadable:
      return "readable";
    case State::kPermissionDenied:
      return "permission_denied";
    case State::kCorrupt:
      return "corrupt";
    case State::kBusy:
      return "busy";
    case State::kRemoved:
      return "removed";
    case State::kStale:
      return "stale";
  }
  return "?";
}

ProcessStats read_process_stats(int pid, const std::string& directory) {
  const std::string dir = directory.empty() ? stats_directory() : directory;
  if (pid <= 0) throw StatsError(Kind::kNoProcess, pid, "no process " + std::to_string(pid));
  Fd d = open_directory(dir, pid);
  std::vector<Named> named;
  for (Named& n : segment_names(d.fd)) {
    if (n.pid == pid) named.push_back(std::move(n));
  }
  if (named.empty()) {
    std::string why_dead;
    if (!owner_alive(pid, 0, &why_dead)) {
      throw StatsError(
          Kind::kNoProcess, pid,
          "no process " + std::to_string(pid) + " (and no segment of it in " + dir + ")");
    }
    throw StatsError(Kind::kNotPublished, pid,
                     "process " + std::to_string(pid) + " publishes no ferry counters in " + dir +
                         " (it has made no request through ferry yet, or publishing is off: "
                         "FERRY_STATS_PUBLISH=0, ferry::publish_stats(false), "
                         "ferry.stats.publish(False))");
  }
  // The segment of the uid the process runs as first, then this user's, then the others: any
  // user may plant one under the pid's name, and one taken first (in directory order) hid the
  // process's own counters from root (issue 45, B7). The others are inspected too (a stale one
  // is removed) and listed beside the counters.
  const std::optional<std::uint32_t> runs_as = process_uid(pid);
  auto rank = [&](const Named& n) {
    const int order = runs_as && n.uid == *runs_as ? 0 : n.uid == ::geteuid() ? 1 : 2;
    return std::make_pair(order, n.uid);
  };
  std::sort(named.begin(), named.end(),
            [&](const Named& a, const Named& b) { return rank(a) < rank(b); });
  Inspection in = inspect(d.fd, dir, named[0].name, named[0].uid, pid, BusyBudget::one());
  if (in.stats) {
    const BusyBudget others = BusyBudget::listing();
    for (std::size_t i = 1; i < named.size(); ++i) {
      Inspection o = inspect(d.fd, dir, named[i].name, named[i].uid, pid, others);
      if (o.state == State::kRemoved && !o.exited) continue;  // gone meanwhile
      in.stats->other_segments.push_back({dir + "/" + named[i].name, to_string(o.state), o.detail});
    }
    return std::move(*in.stats);
  }
  switch (in.state) {
    case State::kPermissionDenied:
      throw StatsError(Kind::kPermissionDenied, pid, in.detail);
    case State::kBusy:
      throw StatsError(Kind::kBusy, pid, in.detail);
    case State::kRemoved:
    case State::kStale:
      if (in.exited) {
        std::string why_dead;
        if (runs_as && owner_alive(pid, 0, &why_dead)) {
          // Only a dead process's segment bore the pid: the process holding it now publishes none.
          throw StatsError(Kind::kNotPublished, pid,
                           "process " + std::to_string(pid) + " publishes no ferry counters in " +
                               dir + " (" + in.detail + ")");
        }
        throw StatsError(Kind::kNoProcess, pid, in.detail);
      }
      [[fallthrough]];
    default:
      throw StatsError(Kind::kCorrupt, pid, in.detail);
  }
}

namespace statistics {

std::size_t remove_dead_segments(const std::string& directory, std::uint32_t uid) {
  Fd d(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd < 0) return 0;
  std::size_t removed = 0;
  for (const Named& n : segment_names(d.fd)) {
    if (n.uid != uid || n.pid == ::getpid()) continue;
    struct stat st {};
    if (::fstatat(d.fd, n.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != uid) {
      continue;
    }
    // Without reading the segment: a pid that is gone, or a zombie, is dead whatever it says.
    std::string why;
    if (!owner_alive(n.pid, 0, &why)) {
      if (remove_segment(d.fd, n.name, st)) ++removed;
      continue;
    }
    // A pid that now runs as another user: this user's process of that pid may have exited and
    // the pid been reused since (issue 45, B13), which only the segment's start time tells.
    const std::optional<std::uint32_t> runs_as = process_uid(n.pid);
    if (!runs_as || *runs_as == uid) continue;
    Fd fd(::openat(d.fd, n.name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (fd.fd >= 0 && left_before_pid_reuse(fd.fd, n.pid, uid, *runs_as, &why) &&
        remove_segment(d.fd, n.name, st)) {
      ++removed;
    }
  }
  return removed;
}

}  // namespace statistics

std::vector<ProcessEntry> list_process_stats(const std::string& directory) {
  const std::string dir = directory.empty() ? stats_directory() : directory;
  Fd d = open_directory(dir, 0);
  std::vector<ProcessEntry> out;
  const BusyBudget busy = BusyBudget::listing();
  for (const Named& n : segment_names(d.fd)) {
    Inspection in = inspect(d.fd, dir, n.name, n.uid, n.pid, busy);
    if (in.state == State::kRemoved && !in.exited) continue;  // gone meanwhile
    ProcessEntry e;
    e.pid = n.pid;
    e.uid = n.uid;
    e.state = in.state;
    e.path = dir + "/" + n.name;
    e.detail = in.detail;
    e.stats = std::move(in.stats);
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(),
            [](const ProcessEntry& a, const ProcessEntry& b) { return a.pid < b.pid; });
  return out;
}

}  // namespace ferry
