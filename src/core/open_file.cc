#include "core/open_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sys/vfs.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>
#include <utility>

#include "core/fork_registry.h"
#include "core/request.h"
#include "core/runtime_state.h"
#include "ferry/error.h"

namespace ferry::core {

// One thread's share of a File's request state (open_file.h, lanes_): its small requests in
// flight, and the last one's route.
class OpenFile::Lane {
 public:
  // Guards the route: held for one copy of it, by the lane's own thread (a lane-mate's past
  // kLanes threads) and by last_route(), so it is nearly always free. A spin, where a std::mutex
  // cost 75 of a small request's instructions in pthread_mutex_lock and unlock (bench/NOTES.md).
  void lock() {
    while (held_.exchange(true, std::memory_order_acquire)) {
      while (held_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() { held_.store(false, std::memory_order_release); }
  // In a fork() child: the holder may have been a thread that does not exist there.
  void forget_holder() { held_.store(false, std::memory_order_relaxed); }

  alignas(64) std::atomic<std::uint64_t> requests{0};
  std::optional<SmallRoute> route;  // under lock()
  std::uint64_t route_ns = 0;       // when that request ended (steady clock); under lock()

 private:
  std::atomic<bool> held_{false};
};

namespace {

// Threads are dealt lanes in turn, once each. Process-wide: a thread's lane is its place in the
// process, the same in every File of every runtime, so the small-read path finds it in one load.
std::size_t this_threads_lane(std::size_t lanes) {
  static std::atomic<std::size_t> next{0};
  thread_local const std::size_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return mine % lanes;
}

constexpr long kProcSuperMagic = 0x9fa0;  // PROC_SUPER_MAGIC in linux/magic.h
constexpr long kSysfsMagic = 0x62656572;  // SYSFS_MAGIC in linux/magic.h

int open_flags(std::string_view mode, const std::string& path, bool* readable, bool* writable) {
  if (mode == "r") {
    *readable = true;
    return O_RDONLY;
  }
  if (mode == "r+") {
    *readable = *writable = true;
    return O_RDWR;
  }
  if (mode == "w") {
    *writable = true;
    return O_WRONLY | O_CREAT | O_TRUNC;
  }
  if (mode == "w+") {
    *readable = *writable = true;
    return O_RDWR | O_CREAT | O_TRUNC;
  }
  if (mode == "a") {
    *writable = true;
    return O_WRONLY | O_CREAT;
  }
  throw Error(fmt::format("open {}: invalid mode '{}'; expected r, r+, w, w+ or a", path, mode));
}

const char* file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  return "not a regular file";
}

// Every OpenFile of the process, so that a child made by fork() can forget the requests its
// parent's threads had in flight: those threads do not exist in the child, and their requests
// would keep close() waiting forever.
using OpenFiles = ForkRegistry<OpenFile, &OpenFile::forget_parent_requests>;

// The seam a File's system calls go through: the one given, else its runtime environment's
// remote seam for a URL, else the environment's own. Throws where a URL has no seam.
io::IoSeam& seam_for(const std::string& path, RuntimeState& runtime, io::IoSeam* given) {
  if (given != nullptr) return *given;
  const Environment& env = runtime.env();
  if (!io::is_remote_url(path)) return *env.io;
  if (env.remote == nullptr) {
    throw IoError(ENOTSUP, "open", io::shown_url(path), 0, 0, 0,
                  "this runtime has no remote sources");
  }
  return *env.remote;
}

}  // namespace

OpenFile::OpenFile(const std::filesystem::path& path, std::string_view mode, FileOptions options,
                   RuntimeState& runtime, io::IoSeam* io)
    : path_(path.string()),
      options_(std::move(options)),
      io_(seam_for(path_, runtime, io)),
      runtime_(&runtime),
      remote_(io == nullptr && io::is_remote_url(path_)),
      lanes_(std::make_unique<Lane[]>(kLanes)) {
  int flags = open_flags(mode, path_, &readable_, &writable_);
  appends_ = mode == "a";
  // O_NONBLOCK keeps open() of a FIFO from waiting for a writer; it is meaningless for the
  // regular files that get past the type check below.
  fd_ = io_.open(path_.c_str(), flags | O_NONBLOCK, 0644);
  if (fd_ < 0) throw IoError(errno, "open", io::shown_url(path_), 0, 0);
  // A remote object's URL may carry a presigned signature in its query: messages and reports
  // show it without (the seam keeps what it needs).
  if (remote_) path_ = io::shown_url(path_);
  struct stat st {};
  if (io_.fstat(fd_, &st) != 0) {
    int err = errno;
    close();
    throw IoError(err, "fstat", path_, 0, 0);
  }
  if (!S_ISREG(st.st_mode)) {
    int err = S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
    close();
    throw IoError(
        err, "open", path_, 0, 0, 0,
        fmt::format("{}; ferry reads and writes regular files only", file_type(st.st_mode)));
  }
  // /proc files report size 0 and are generated as they are read; requests are split by the
  // size fstat reports, so such a file would silently read as empty. Refuse it instead.
  struct statfs fs {};
  if (fstatfs(fd_, &fs) == 0 && fs.f_type == kProcSuperMagic) {
    close();
    throw IoError(EINVAL, "open", path_, 0, 0, 0,
                  "a /proc file: its size is not known before it is read; ferry reads regular "
                  "files of known size (copy it to a regular file first)");
  }
  // Sysfs attributes report 4096 B and end sooner: a cold O_DIRECT read of one would meet a
  // short count mid-block. They are read buffered, where a short read is their end.
  if (fs.f_type == kSysfsMagic) {
    cold_tried_ = true;
    cold_refused_ = fmt::format("{} is a sysfs file: read buffered", path_);
  }
  if (remote_) {
    cold_tried_ = true;
    cold_refused_ = "a remote object: no page cache to bypass";
  }
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  if (options_.direct && remote_) {
    direct_refused_ = fmt::format(
        "O_DIRECT does not apply to {}: a remote object has no page cache to bypass", path_);
  } else if (options_.direct) {
    // The second descriptor never creates or truncates: the first open already did.
    int dflags = (flags & ~(O_CREAT | O_TRUNC)) | O_DIRECT;
    direct_fd_ = io_.open(path_.c_str(), dflags, 0);
    if (direct_fd_ < 0) {
      // tmpfs answers EINVAL: not an error for the request, a route decision with a reason.
      direct_refused_ = fmt::format("O_DIRECT refused for {}: {}; using buffered I/O", path_,
                                    std::strerror(errno));
    }
  }
  runtime_->attach();
  attached_ = true;
  OpenFiles::add(this);
}

OpenFile::~OpenFile() {
  try {
    close();
  } catch (const IoError&) {
    // A destructor cannot report it; callers who care call File::close() or sync() first.
  }
  OpenFiles::remove(this);
}

void OpenFile::forget_parent_requests() {
  requests_.store(requests_.load(std::memory_order_relaxed) & kClosing, std::memory_order_relaxed);
  for (std::size_t i = 0; i < kLanes; ++i) {
    lanes_[i].requests.store(0, std::memory_order_relaxed);
    lanes_[i].forget_holder();
  }
  new (&idle_mu_) std::mutex;
  new (&idle_) std::condition_variable;
  new (&route_mu_) std::mutex;
  new (&attachment_mu_) std::mutex;
  new (&append_mu_) std::mutex;
  new (&close_mu_) std::mutex;
}

namespace {
// Per thread by design: the File whose request this thread is inside (RequestHold), innermost.
thread_local const OpenFile* tl_held = nullptr;
}  // namespace

RequestHold::RequestHold(OpenFile& file, const char* op) : file_(file), previous_(tl_held) {
  file_.begin_request(op);
  tl_held = &file_;
}

RequestHold::~RequestHold() {
  tl_held = previous_;
  file_.end_request();
}

const OpenFile* RequestHold::held() { return tl_held; }

void OpenFile::begin_request(const char* op) {
  // close() sets kClosing before it waits for the count to drain, and touches the descriptors
  // only after: a request counted without kClosing runs on open descriptors. Under a hold the
  // count is already above zero, so close() is still waiting.
  if ((requests_.fetch_add(1, std::memory_order_acq_rel) & kClosing) != 0 && tl_held != this) {
    end_request();
    throw IoError(EBADF, op, path_, 0, 0, 0, "file is closed");
  }
}

void OpenFile::end_request() {
  const std::uint64_t before = requests_.fetch_sub(1, std::memory_order_acq_rel);
  if (appends_ && (before & ~kClosing) == 1) release_append_lock_if_idle();
  if (before == (kClosing | 1)) {
    // The last request under a close(): wake it. Taking the lock orders this with its wait.
    std::lock_guard lock(idle_mu_);
    idle_.notify_all();
  }
}

OpenFile::Lane* OpenFile::begin_small() {
  Lane& lane = lanes_[this_threads_lane(kLanes)];
  // Sequentially consistent, as close(): either close() sees this count, or this sees kClosing.
  lane.requests.fetch_add(1, std::memory_order_seq_cst);
  if ((requests_.load(std::memory_order_seq_cst) & kClosing) != 0 && tl_held != this) {
    end_small(&lane);
    return nullptr;
  }
  return &lane;
}

void OpenFile::end_small(Lane* lane) {
  lane->requests.fetch_sub(1, std::memory_order_seq_cst);
  if ((requests_.load(std::memory_order_seq_cst) & kClosing) != 0) {
    // Under a close(): it may be waiting for this one. Taking the lock orders this with its wait.
    std::lock_guard lock(idle_mu_);
    idle_.notify_all();
  }
}

bool OpenFile::idle() const {
  if (requests_.load(std::memory_order_seq_cst) != kClosing) return false;
  for (std::size_t i = 0; i < kLanes; ++i) {
    if (lanes_[i].requests.load(std::memory_order_seq_cst) != 0) return false;
  }
  return true;
}

void OpenFile::close() {
  // Two threads may close at once: the second waits for the first, then finds nothing to do.
  std::lock_guard closing(close_mu_);
  {
    requests_.fetch_or(kClosing, std::memory_order_seq_cst);
    std::unique_lock lock(idle_mu_);
    idle_.wait(lock, [this] { return idle(); });
  }
  {
    std::lock_guard lock(attachment_mu_);
    attachment_.reset();
  }
  int failed_errno = 0;
  {
    // Under append_mu_: the last request's end may still be releasing the append lock on fd_.
    // Closing the descriptor releases the lock anyway.
    std::lock_guard lock(append_mu_);
    append_locked_ = false;
    for (int* fd : {&cold_fd_, &direct_fd_, &fd_}) {
      if (*fd >= 0 && io_.close(*fd) != 0 && failed_errno == 0) failed_errno = errno;
      *fd = -1;
    }
  }
  if (std::exchange(attached_, false)) runtime_->detach();
  if (failed_errno != 0) throw IoError(failed_errno, "close", path_, 0, 0);
}

int OpenFile::cold_direct_fd() {
  if (direct_fd_ >= 0) return direct_fd_;
  if (!readable_) return -1;
  std::lock_guard lock(attachment_mu_);
  if (!cold_tried_ && fd_ >= 0) {
    cold_tried_ = true;
    // Read-only: cold reads never write, and the first open already created the file.
    cold_fd_ = io_.open(path_.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC, 0);
    if (cold_fd_ < 0) {
      cold_refused_ = fmt::format("O_DIRECT refused for {}: {}; cold tasks read buffered", path_,
                                  std::strerror(errno));
    }
  }
  return cold_fd_;
}

std::string OpenFile::cold_direct_refused() const {
  std::lock_guard lock(attachment_mu_);
  return cold_refused_;
}

namespace {
// An OFD lock over the whole file: it belongs to the open file description, so two Files of one
// process exclude each other as two processes do (a POSIX record lock would not).
int append_lock(int fd, short type, int cmd) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  int rc;
  do {
    rc = ::fcntl(fd, cmd, &l);
  } while (rc != 0 && errno == EINTR);
  return rc;
}
}  // namespace

std::uint64_t OpenFile::reserve_append(std::size_t size) {
  std::lock_guard lock(append_mu_);
  if (!append_locked_ && fd_ >= 0) {
    if (append_lock(fd_, F_WRLCK, F_OFD_SETLKW) == 0) {
      append_locked_ = true;
    } else if (errno != EINVAL && errno != ENOLCK && errno != EOPNOTSUPP) {
      throw IoError(errno, "fcntl", path_, 0, size, 0,
                    fmt::format("{} (taking the append lock, F_OFD_SETLKW)", std::strerror(errno)));
    }
    // A file system without record locks: appends stay ordered within this File only
    // (docs/reliability.md).
  }
  const std::uint64_t at = std::max(this->size(), append_end_);
  append_end_ = at + size;
  return at;
}

void OpenFile::release_append_lock_if_idle() {
  std::lock_guard lock(append_mu_);
  // A request begun since (another append) keeps it: it is released when that one ends.
  if (!append_locked_ || (requests_.load(std::memory_order_acquire) & ~kClosing) != 0) return;
  if (fd_ >= 0) append_lock(fd_, F_UNLCK, F_OFD_SETLK);
  append_locked_ = false;
}

Settings OpenFile::settings() const { return runtime_->env().settings(options_.settings); }

std::uint64_t OpenFile::size() const {
  struct stat st {};
  if (fd_ < 0) throw IoError(EBADF, "fstat", path_, 0, 0, 0, "file is closed");
  if (io_.fstat(fd_, &st) != 0) throw IoError(errno, "fstat", path_, 0, 0);
  return static_cast<std::uint64_t>(st.st_size);
}

void OpenFile::set_last_route(const RouteReport& report) {
  // The runtime's clock, as small requests' ends (set_last_route below) are.
  const std::uint64_t now = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(runtime_->env().now().time_since_epoch())
          .count());
  std::lock_guard lock(route_mu_);
  last_route_ = report;
  last_route_ns_ = now;
}

void OpenFile::set_last_route(Lane* lane, const SmallRoute& route, std::uint64_t ended_ns) {
  std::lock_guard lock(*lane);  // this thread's (or a lane-mate's): not the File's
  lane->route = route;
  lane->route_ns = ended_ns;
}

std::shared_ptr<void> OpenFile::attachment(const std::function<std::shared_ptr<void>()>& make) {
  std::lock_guard lock(attachment_mu_);
  if (fd_ < 0) return nullptr;
  if (attachment_ == nullptr) attachment_ = make();
  return attachment_;
}

RouteReport OpenFile::last_route() const {
  // The request that ended last: a full one, or the newest small one of any lane.
  std::optional<SmallRoute> small;
  std::uint64_t newest = 0;
  for (std::size_t i = 0; i < kLanes; ++i) {
    std::lock_guard lock(lanes_[i]);
    if (lanes_[i].route && lanes_[i].route_ns >= newest) {
      newest = lanes_[i].route_ns;
      small = lanes_[i].route;
    }
  }
  {
    std::lock_guard lock(route_mu_);
    if (!small || last_route_ns_ > newest) return last_route_;
  }
  return small_report(path_, *small, small->cold_refused ? cold_direct_refused() : "");
}

}  // namespace ferry::core
