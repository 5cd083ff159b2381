#include "stats/stats_publish.h"

#include <fcntl.h>
#include <linux/membarrier.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <string_view>

#include "base/fd.h"
#include "base/variables.h"
#include "ferry/error.h"
#include "ferry/stats.h"
#include "stats/stats_layout.h"

#ifndef FERRY_VERSION_MAJOR
#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 0
#define FERRY_VERSION_PATCH 0
#endif

namespace ferry::statistics {
namespace L = stats_layout;
namespace {

std::string errno_text(int e) { return std::strerror(e); }

// A small /proc file, with open and read (no iostreams: this runs in a process's first request).
std::string slurp(const char* path) {
  std::string out;
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[1024];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > 65536) break;
  }
  ::close(fd);
  return out;
}

using base::Fd;

void write_header(std::atomic<std::uint64_t>* h, const ProcessIdentity& who,
                  std::uint64_t counting_since_ns) {
  auto set = [h](std::size_t i, std::uint64_t v) { h[i].store(v, std::memory_order_relaxed); };
  set(L::kHVersion, L::kVersion);
  set(L::kHHeaderBytes, L::kHeaderBytes);
  set(L::kHSlotBytes, L::kSlotBytes);
  set(L::kHSlotCount, L::kSlots);
  set(L::kHSegmentBytes, L::kSegmentBytes);
  set(L::kHBuckets, L::kBuckets);
  set(L::kHReasonWords, L::kReasonWords);
  set(L::kHHistBuckets, L::kHistBuckets);
  set(L::kHHighWater, L::kFirstThreadSlot);
  set(L::kHPid, who.pid);
  set(L::kHUid, who.uid);
  set(L::kHStartTicks, who.start_ticks);
  set(L::kHProcessStartedNs, who.started_unix_ns);
  set(L::kHCountingSinceNs, counting_since_ns);
  set(L::kHFerryVersion, (std::uint64_t{FERRY_VERSION_MAJOR} << 32) |
                             (std::uint64_t{FERRY_VERSION_MINOR} << 16) | FERRY_VERSION_PATCH);
  for (std::size_t w = 0; w < L::kCommWords; ++w) {
    std::uint64_t v = 0;
    std::memcpy(&v, who.comm + w * 8, 8);
    set(L::kHComm + w, v);
  }
  h[L::kHMagic].store(L::kMagic, std::memory_order_release);
}

// Maps `fd` (already kSegmentBytes long) and writes the header.
std::atomic<std::uint64_t>* map_and_init(int fd, const ProcessIdentity& who,
                                         std::uint64_t counting_since_ns, std::string* why) {
  void* p = ::mmap(nullptr, L::kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *why = "mmap: " + errno_text(errno);
    return nullptr;
  }
  auto* words = static_cast<std::atomic<std::uint64_t>*>(p);
  write_header(words, who, counting_since_ns);
  return words;
}

// What is under `name` now, when linking failed with EEXIST: a segment this process may replace
// (left by an earlier process of the same pid, which has exited) or not.
bool replaceable(int dirfd, const std::string& name, const ProcessIdentity& who, std::string* why) {
  Fd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (fd.fd < 0 || ::fstat(fd.fd, &st) != 0) {
    *why = name + " exists and cannot be opened (" + errno_text(errno) + ")";
    return false;
  }
  if (!S_ISREG(st.st_mode) || st.st_uid != who.uid) {
    *why = name + " exists and belongs to uid " + std::to_string(st.st_uid) +
           " (or is not a regular file): not replacing it";
    return false;
  }
  // Ours by owner and by name (our uid, our pid): no live process but this one can have made it.
  return true;
}

}  // namespace

std::string segment_name(std::uint64_t uid, std::uint64_t pid) {
  return std::string(L::kNamePrefix) + std::to_string(uid) + "." + std::to_string(pid);
}

bool parse_segment_name(const std::string& name, std::uint32_t* uid, int* pid) {
  std::string_view s(name);
  const std::string_view prefix(L::kNamePrefix);
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  auto number = [&s](std::uint64_t limit, std::uint64_t* out) {
    std::uint64_t v = 0;
    std::size_t n = 0;
    while (n < s.size() && s[n] >= '0' && s[n] <= '9') {
      v = v * 10 + static_cast<std::uint64_t>(s[n] - '0');
      if (v > limit || n >= 10) return false;
      ++n;
    }
    if (n == 0 || (n > 1 && s[0] == '0')) return false;
    s.remove_prefix(n);
    *out = v;
    return true;
  };
  std::uint64_t u = 0, p = 0;
  if (!number(0xffffffffull, &u) || s.empty() || s[0] != '.') return false;
  s.remove_prefix(1);
  if (!number(0x7fffffffull, &p) || !s.empty() || p == 0) return false;
  *uid = static_cast<std::uint32_t>(u);
  *pid = static_cast<int>(p);
  return true;
}

std::uint64_t unix_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

std::uint64_t parse_start_ticks(const std::string& text, char* state) {
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
  if (state != nullptr) *state = '?';
  const std::size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::size_t i = close + 1;
  if (state != nullptr && i + 1 < text.size() && text[i] == ' ') *state = text[i + 1];
  // Fields 3.. follow; starttime is field 22, the 20th after the parenthesis.
  for (int field = 3; field < 22; ++field) {
    while (i < text.size() && text[i] == ' ') ++i;
    while (i < text.size() && text[i] != ' ') ++i;
  }
  while (i < text.size() && text[i] == ' ') ++i;
  std::uint64_t v = 0;
  std::size_t digits = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9' && digits < 20) {
    v = v * 10 + static_cast<std::uint64_t>(text[i] - '0');
    ++i;
    ++digits;
  }
  return digits == 0 ? 0 : v;
}

std::uint64_t read_start_ticks(long pid, char* state) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  return parse_start_ticks(slurp(path.c_str()), state);
}

ProcessIdentity this_process() {
  ProcessIdentity who;
  who.pid = static_cast<std::uint64_t>(::getpid());
  who.uid = static_cast<std::uint64_t>(::geteuid());
  who.start_ticks = read_start_ticks(::getpid(), nullptr);
  // The start time counts clock ticks since boot (CLOCK_BOOTTIME): the unix time is now less the
  // time since then. (Not /proc/stat's btime: that file is slow to make on machines of many CPUs.)
  const long hz = ::sysconf(_SC_CLK_TCK);
  timespec boot{};
  if (hz > 0 && who.start_ticks != 0 && clock_gettime(CLOCK_BOOTTIME, &boot) == 0) {
    const std::uint64_t boot_ns = static_cast<std::uint64_t>(boot.tv_sec) * 1000000000ull +
                                  static_cast<std::uint64_t>(boot.tv_nsec);
    const std::uint64_t start_ns =
        who.start_ticks / static_cast<std::uint64_t>(hz) * 1000000000ull +
        who.start_ticks % static_cast<std::uint64_t>(hz) * 1000000000ull /
            static_cast<std::uint64_t>(hz);
    const std::uint64_t now = unix_now_ns();
    if (boot_ns >= start_ns && now >= boot_ns - start_ns) {
      who.started_unix_ns = now - (boot_ns - start_ns);
    }
  }
  std::string comm = slurp("/proc/self/comm");
  while (!comm.empty() && (comm.back() == '\n' || comm.back() == '\0')) comm.pop_back();
  std::strncpy(who.comm, comm.c_str(), sizeof who.comm - 1);
  return who;
}

std::optional<SegmentMemory> create_published_segment(const std::string& directory,
                                                      const ProcessIdentity& who,
                                                      std::uint64_t counting_since_ns,
                                                      std::string* why, bool* no_space) {
  Fd dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.fd < 0) {
    *why = "cannot open the stats directory " + directory + ": " + errno_text(errno);
    return std::nullopt;
  }
  const std::string name = segment_name(who.uid, who.pid);
  const std::string path = directory + "/" + name;
  // An unnamed file (O_TMPFILE) linked under its name once complete, so that no reader ever
  // finds a half-made one; where the file system has no O_TMPFILE, a temporary name instead.
  std::string temp;
  int raw = ::openat(dir.fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (raw < 0) {
    temp = "." + name + ".new";
    ::unlinkat(dir.fd, temp.c_str(), 0);  // one left by a crash of an earlier process of our pid
    raw = ::openat(dir.fd, temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (raw < 0) {
      *why = "cannot create a file in " + directory + ": " + errno_text(errno);
      return std::nullopt;
    }
  }
  Fd fd(raw);
  auto fail = [&](const std::string& what) {
    *why = what;
    if (!temp.empty()) ::unlinkat(dir.fd, temp.c_str(), 0);
    return std::nullopt;
  };
  struct stat st {};
  if (::fchmod(fd.fd, 0600) != 0 || ::fstat(fd.fd, &st) != 0) {
    return fail("fchmod " + path + ": " + errno_text(errno));
  }
  // Every page reserved before it is mapped: a sparse file's page that a full tmpfs cannot
  // supply when a thread first stores into it is SIGBUS in that thread, whatever it was doing
  // (issue 30: Docker's /dev/shm holds 64 MB). The segment then costs its full size at once.
  if (const int e = ::posix_fallocate(fd.fd, 0, static_cast<off_t>(L::kSegmentBytes)); e != 0) {
    if (no_space != nullptr) *no_space = e == ENOSPC || e == EDQUOT || e == EFBIG;
    return fail("no room for the " + std::to_string(L::kSegmentBytes) + "-byte segment in " +
                directory + " (posix_fallocate: " + errno_text(e) + ")");
  }
  std::atomic<std::uint64_t>* words = map_and_init(fd.fd, who, counting_since_ns, why);
  if (words == nullptr) return fail(*why);
  SegmentMemory m;
  m.words = words;
  m.bytes = L::kSegmentBytes;
  m.dev = st.st_dev;
  m.ino = st.st_ino;
  for (int attempt = 0; attempt < 2; ++attempt) {
    int rc;
    if (temp.empty()) {
      const std::string self = "/proc/self/fd/" + std::to_string(fd.fd);
      rc = ::linkat(AT_FDCWD, self.c_str(), dir.fd, name.c_str(), AT_SYMLINK_FOLLOW);
    } else {
      rc = ::linkat(dir.fd, temp.c_str(), dir.fd, name.c_str(), 0);
    }
    if (rc == 0) {
      if (!temp.empty()) ::unlinkat(dir.fd, temp.c_str(), 0);
      m.path = path;
      return m;
    }
    const int e = errno;
    if (e == EEXIST && attempt == 0 && replaceable(dir.fd, name, who, why)) {
      ::unlinkat(dir.fd, name.c_str(), 0);
      continue;
    }
    if (e != EEXIST) *why = "cannot link " + path + ": " + errno_text(e);
    break;
  }
  unmap_segment(m);
  return fail(*why);
}

SegmentMemory create_private_segment(const ProcessIdentity& who, std::uint64_t counting_since_ns) {
  SegmentMemory m;
  m.bytes = L::kSegmentBytes;
  void* p =
      ::mmap(nullptr, L::kSegmentBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p != MAP_FAILED) {
    m.words = static_cast<std::atomic<std::uint64_t>*>(p);
  } else {
    // No memory to map: counting must not fail a request, so a small static block serves, its
    // header, the retired slot and the shared one (every thread then counts in the shared
    // slot), zeroed first (a fork child may reuse its parent's copy). Small on purpose: a
    // 516 KiB block in .bss made every 4 KiB read 20 ns slower (bench/NOTES.md §14).
    constexpr std::size_t kWords = L::kPageWords + L::kFirstThreadSlot * L::kSlotWords;
    // Process-wide, as the segment it stands in for is; static, as no memory could be mapped.
    alignas(64) static std::atomic<std::uint64_t> reserve[kWords];
    for (auto& w : reserve) w.store(0, std::memory_order_relaxed);
    m.words = reserve;
    m.bytes = kWords * 8;
    m.slots = L::kFirstThreadSlot;
    m.static_storage = true;
  }
  write_header(m.words, who, counting_since_ns);
  return m;
}

void withdraw_segment(SegmentMemory& m) {
  if (m.path.empty()) return;
  struct stat st {};
  // Only the name of this very file: a later process may have taken the name since.
  if (::lstat(m.path.c_str(), &st) == 0 && st.st_dev == m.dev && st.st_ino == m.ino) {
    ::unlink(m.path.c_str());
  }
  m.path.clear();
}

void unmap_segment(SegmentMemory& m) {
  if (m.words != nullptr && !m.static_storage) ::munmap(static_cast<void*>(m.words), m.bytes);
  m.words = nullptr;
}

bool heavy_barrier(std::string* why) {
#ifdef SYS_membarrier
  // Process-wide, as membarrier's registration is; callers hold the registry lock.
  static pid_t registered_for = 0;
  if (registered_for != ::getpid()) {
    if (::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0) {
      registered_for = ::getpid();
    }
  }
  if (registered_for == ::getpid() &&
      ::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) {
    return true;
  }
  if (::syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0) return true;
  *why = "membarrier(2): " + errno_text(errno);
  return false;
#else
  *why = "membarrier(2) is not available";
  return false;
#endif
}

bool publish_from_environment(std::string* why) {
  try {
    const base::Reading publish = base::read(base::kStatsPublish);
    if (publish.value == "on") return true;
    *why = std::string(publish.env) + "=" + std::getenv(publish.env);  // off, as it says
  } catch (const SettingError& e) {
    *why = std::string(e.what()) + ": not publishing";
  }
  return false;
}

}  // namespace ferry::statistics
