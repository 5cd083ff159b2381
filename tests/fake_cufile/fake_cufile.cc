// TEST DOUBLE of libcufile's C ABI, for the tests only: never installed, never loaded unless
// FERRY_CUFILE_LIBRARY names it. It moves bytes with pread/pwrite into HOST memory that stands in
// for GPU memory, and counts its level-3 statistics the way cuFile 1.15 was measured to on the
// GPU machine: one request of `size` bytes is cut into
//   pieces = min(max_request_parallelism, max(1, size / min_io_threshold_size))
// pieces (defaults 4 and 8 MiB), counted under n_posix_reads, or n_nvfs_reads as if nvidia-fs
// were loaded. Environment switches, read at each call so one test process can change them:
//   FERRY_FAKE_CUFILE_NVFS=1             count pieces as nvfs (CUFILE_FORCE_COMPAT_MODE=true wins)
//   FERRY_FAKE_CUFILE_POSIX_FILES=TEXT   ...except for files whose path contains TEXT (read at
//                                        registration), counted under posix as cuFile would
//                                        for a file nvidia-fs cannot serve
//   FERRY_FAKE_CUFILE_GPU1_FILES=TEXT    files whose path contains TEXT (read at registration)
//                                        are counted on a second GPU's entry, UUID
//                                        "fake-cufile-gpu1", listed before GPU 0's
//                                        ("fake-cufile-gpu0"), as if their buffers were GPU 1's
//   FERRY_FAKE_CUFILE_DRIVER_OPEN_ERROR  cuFileDriverOpen fails with this code (e.g. 5001)
//   FERRY_FAKE_CUFILE_HANDLE_ERROR       cuFileHandleRegister fails with this code (e.g. 5027)
//   FERRY_FAKE_CUFILE_IO_RESULT          cuFileRead/Write return this (-1 sets errno EIO, -5044)
//   FERRY_FAKE_CUFILE_IO_FAIL_FROM       ...only at file offsets >= this (default 0)
//   FERRY_FAKE_CUFILE_VERSION            cuFileGetVersion's answer (default 1150)
//   FERRY_FAKE_CUFILE_DELAY_US           each cuFileRead/Write first sleeps this long
//   FERRY_FAKE_CUFILE_MIN_IO_KB, FERRY_FAKE_CUFILE_MAX_PARALLELISM  the cut (8192, 4)
// As with the real library, refusing compatibility mode before cuFileDriverOpen makes the open
// fail with 5001 unless FERRY_FAKE_CUFILE_NVFS=1. Built without cuFileRead when
// FERRY_FAKE_OMIT_READ is defined, to exercise the loader's missing-symbol branch.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "cufile/cufile_abi.h"

namespace abi = ferry::cufile::abi;

namespace {

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::strtol(v, nullptr, 10);
}

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

abi::Error status(int code) { return abi::Error{code, 0}; }

struct Fake {
  std::mutex mu;
  bool open = false;
  bool allow_compat = true;
  int stats_level = 0;
  bool stats_started = false;
  abi::PerGpuStats gpu{};
  abi::PerGpuStats gpu1{};  // FERRY_FAKE_CUFILE_GPU1_FILES's
  long read_calls = 0;
  long write_calls = 0;
  long handles = 0;
};

Fake& fake() {
  static Fake* f = new Fake();
  return *f;
}

struct FakeHandle {
  int fd;                   // the same file without O_DIRECT, so host buffers need no alignment
  bool posix_only = false;  // FERRY_FAKE_CUFILE_POSIX_FILES matched its path
  bool gpu1 = false;        // FERRY_FAKE_CUFILE_GPU1_FILES matched its path
};

bool counts_as_nvfs() {
  return env_is("FERRY_FAKE_CUFILE_NVFS", "1") && !env_is("CUFILE_FORCE_COMPAT_MODE", "true");
}

std::uint64_t pieces(std::size_t size) {
  std::uint64_t min_io = static_cast<std::uint64_t>(env_long("FERRY_FAKE_CUFILE_MIN_IO_KB", 8192))
                         << 10;
  std::uint64_t max_par =
      static_cast<std::uint64_t>(env_long("FERRY_FAKE_CUFILE_MAX_PARALLELISM", 4));
  return std::min<std::uint64_t>(max_par, std::max<std::uint64_t>(1, size / min_io));
}

// Counts one request the way cuFile's level-3 statistics do.
void count(bool read, std::size_t size, ssize_t result, const FakeHandle& handle) {
  Fake& f = fake();
  std::lock_guard lock(f.mu);
  if (!f.stats_started || f.stats_level < 3) return;
  abi::PerGpuStats& g = handle.gpu1 ? f.gpu1 : f.gpu;
  std::uint64_t n = pieces(size);
  bool nvfs = counts_as_nvfs() && !handle.posix_only;
  if (read) {
    g.n_total_reads += n;
    (nvfs ? g.n_nvfs_reads : g.n_posix_reads) += n;
    if (result < 0) ++g.n_reads_err;
    if (result > 0) g.read_bytes += static_cast<std::uint64_t>(result);
  } else {
    g.n_total_writes += n;
    (nvfs ? g.n_nvfs_writes : g.n_posix_writes) += n;
    if (result < 0) ++g.n_writes_err;
    if (result > 0) g.writes_bytes += static_cast<std::uint64_t>(result);
  }
}

// The failure FERRY_FAKE_CUFILE_IO_RESULT asks for at this offset, or 0.
ssize_t injected_failure(off_t file_offset) {
  if (long delay = env_long("FERRY_FAKE_CUFILE_DELAY_US", 0); delay > 0) {
    ::usleep(static_cast<useconds_t>(delay));
  }
  long result = env_long("FERRY_FAKE_CUFILE_IO_RESULT", 0);
  if (result >= 0 || file_offset < env_long("FERRY_FAKE_CUFILE_IO_FAIL_FROM", 0)) return 0;
  if (result == -1) errno = EIO;
  return static_cast<ssize_t>(result);
}

// The path of a registered descriptor contains the text of environment variable `name`.
bool path_has(const char* fd_path, const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return false;
  char target[4096];
  ssize_t n = ::readlink(fd_path, target, sizeof target - 1);
  return n > 0 && std::string(target, static_cast<std::size_t>(n)).find(text) != std::string::npos;
}

template <typename Level3>
void fill(void* out, const Fake& f) {
  auto* l3 = static_cast<Level3*>(out);
  std::memset(l3, 0, sizeof(Level3));
  std::uint32_t i = 0;
  if (const char* g1 = std::getenv("FERRY_FAKE_CUFILE_GPU1_FILES"); g1 != nullptr && *g1) {
    l3->per_gpu_stats[i] = f.gpu1;
    std::memcpy(l3->per_gpu_stats[i].uuid, "fake-cufile-gpu1", abi::kGpuUuidLen);
    ++i;
  }
  l3->per_gpu_stats[i] = f.gpu;
  std::memcpy(l3->per_gpu_stats[i].uuid, "fake-cufile-gpu0", abi::kGpuUuidLen);
  l3->num_gpus = i + 1;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) abi::Error cuFileDriverOpen() {
  Fake& f = fake();
  std::lock_guard lock(f.mu);
  long code = env_long("FERRY_FAKE_CUFILE_DRIVER_OPEN_ERROR", 0);
  if (code != 0) return status(static_cast<int>(code));
  // Like cuFile without nvidia-fs: with compatibility refused there is nothing left to open.
  if (!f.allow_compat && !counts_as_nvfs()) return status(abi::kDriverNotInitialized);
  f.open = true;
  return status(abi::kSuccess);
}

__attribute__((visibility("default"))) abi::Error cuFileDriverClose_v2() {
  Fake& f = fake();
  std::lock_guard lock(f.mu);
  if (!f.open) return status(abi::kDriverNotInitialized);
  f.open = false;
  return status(abi::kSuccess);
}

__attribute__((visibility("default"))) abi::Error cuFileDriverClose() {
  return cuFileDriverClose_v2();
}

__attribute__((visibility("default"))) abi::Error cuFileGetVersion(int* version) {
  if (version == nullptr) return status(abi::kInvalidValue);
  *version = static_cast<int>(env_long("FERRY_FAKE_CUFILE_VERSION", 1150));
  return status(abi::kSuccess);
}

__attribute__((visibility("default"))) abi::Error cuFileSetParameterBool(int param, bool value) {
  Fake& f = fake();
  std::lock_guard lock(f.mu);
  if (param != abi::kParamAllowCompatMode) return status(abi::kInvalidValue);
  if (f.open) return status(abi::kDriverAlreadyOpen);
  f.allow_compat = value;
  return status(abi::kSuccess);
}

__attribute__((visibility("default"))) abi::Error cuFileHandleRegister(abi::Handle* fh,
                                                                       abi::Descr* descr) {
  if (fh == nullptr || descr == nullptr || descr->type != abi::kHandleTypeOpaqueFd) {
    return status(abi::kInvalidValue);
  }
  if (!fake().open) return status(abi::kDriverNotInitialized);
  long code = env_long("FERRY_FAKE_CUFILE_HANDLE_ERROR", 0);
  if (code != 0) return status(static_cast<int>(code));
  int flags = fcntl(descr->handle.fd, F_GETFL);
  if (flags < 0) return status(abi::kInvalidValue);
  if ((flags & O_DIRECT) == 0) return status(abi::kDioNotSet);
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", descr->handle.fd);
  int fd = ::open(path, (flags & O_ACCMODE) | O_CLOEXEC);
  if (fd < 0) return status(abi::kInvalidFileType);
  *fh = new FakeHandle{fd, path_has(path, "FERRY_FAKE_CUFILE_POSIX_FILES"),
                       path_has(path, "FERRY_FAKE_CUFILE_GPU1_FILES")};
  std::lock_guard lock(fake().mu);
  ++fake().handles;
  return status(abi::kSuccess);
}

__attribute__((visibility("default"))) void cuFileHandleDeregister(abi::Handle fh) {
  auto* h = static_cast<FakeHandle*>(fh);
  if (h == nullptr) return;
  ::close(h->fd);
  delete h;
  std::lock_guard lock(fake().mu);
  --fake().handles;
}

__attribute__((visibility("default"))) abi::Error cuFileBufRegister(const void* base,
                                                                    std::size_t length, int) {
  if (base == nullptr || length == 0) return status(abi::kInvalidValue);
  if (!fake().open) return status(abi::kDriverNotInitialized);
  return status(abi::kSuccess);
}

__attribute__((visibility("default"))) abi::Error cuFileBufDeregister(const void* base) {
  return status(base == nullptr ? abi::kInvalidValue : abi::kSuccess);
}

#ifndef FERRY_FAKE_OMIT_READ
__attribute__((visibility("default"))) ssize_t cuFileRead(abi::Handle fh, void* base,
                                                          std::size_t size, off_t file_offset,
                                                          off_t base_offset) {
  {
    std::lock_guard lock(fake().mu);
    ++fake().read_calls;
  }
  auto* h = static_cast<FakeHandle*>(fh);
  if (h == nullptr || base == nullptr) return -abi::kInvalidValue;
  ssize_t result = injected_failure(file_offset);
  if (result == 0) {
    char* dst = static_cast<char*>(base) + base_offset;
    std::size_t done = 0;
    while (done < size) {
      ssize_t n = ::pread(h->fd, dst + done, size - done, file_offset + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (n < 0) done = static_cast<std::size_t>(-1);
        break;
      }
      done += static_cast<std::size_t>(n);
    }
    result = done == static_cast<std::size_t>(-1) ? -1 : static_cast<ssize_t>(done);
  }
  int saved = errno;
  count(true, size, result, *h);
  errno = saved;
  return result;
}
#endif

__attribute__((visibility("default"))) ssize_t cuFileWrite(abi::Handle fh, const void* base,
                                                           std::size_t size, off_t file_offset,
                                                           off_t base_offset) {
  {
    std::lock_guard lock(fake().mu);
    ++fake().write_calls;
  }
  auto* h = static_cast<FakeHandle*>(fh);
  if (h == nullptr || base == nullptr) return -abi::kInvalidValue;
  ssize_t result = injected_failure(file_offset);
  if (result == 0) {
    const char* src = static_cast<const char*>(base) + base_offset;
    std::size_t done = 0;
    while (done < size) {
      ssize_t n = ::pwrite(h->fd, src + done, size - done, file_offset + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        result = -1;
        break;
      }
      done += static_cast<std::size_t>(n);
    }
    if (result == 0) result = static_cast<ssize_t>(done);
  }
  int saved = errno;
  count(false, size, result, *h);
  errno = saved;
  return result;
}

__attribute__((visibility("default"))) abi::Error cuFileSetStatsLevel(int level) {
  if (level < 0 || level > 3) return status(abi::kInvalidValue);
  std::lock_guard lock(fake().mu);
  fake().stats_level = level;
  return status(abi::kSuccess);
}

__attribute__((visibility("default"))) abi::Error cuFileStatsStart() {
  std::lock_guard lock(fake().mu);
  if (fake().stats_level == 0) return status(abi::kInvalidValue);
  fake().stats_started = true;
  return status(abi::kSuccess);
}

__attribute__((visibility("default"))) abi::Error cuFileGetStatsL3(void* stats) {
  if (stats == nullptr) return status(abi::kInvalidValue);
  Fake& f = fake();
  std::lock_guard lock(f.mu);
  if (!f.stats_started || f.stats_level < 3) return status(abi::kInvalidValue);
  if (env_long("FERRY_FAKE_CUFILE_VERSION", 1150) >= 1190) {
    fill<abi::StatsLevel3V2>(stats, f);
  } else {
    fill<abi::StatsLevel3V1>(stats, f);
  }
  return status(abi::kSuccess);
}

// Not part of cuFile: what the tests ask the double about its calls.
__attribute__((visibility("default"))) long ferry_fake_cufile_read_calls() {
  std::lock_guard lock(fake().mu);
  return fake().read_calls;
}

__attribute__((visibility("default"))) long ferry_fake_cufile_write_calls() {
  std::lock_guard lock(fake().mu);
  return fake().write_calls;
}

__attribute__((visibility("default"))) long ferry_fake_cufile_open_handles() {
  std::lock_guard lock(fake().mu);
  return fake().handles;
}

__attribute__((visibility("default"))) bool ferry_fake_cufile_driver_open() {
  std::lock_guard lock(fake().mu);
  return fake().open;
}

}  // extern "C"
