// The state behind a ferry::File: its descriptors (buffered, and O_DIRECT where asked and
// allowed), its settings overrides and its last route. Shared by the File and its requests in
// flight, so a moved or closed File never frees state a request still uses. Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "cuda/quick_memory.h"
#include "ferry/file.h"
#include "ferry/route.h"
#include "io/io_seam.h"

namespace ferry::core {

class HostPath;

// A one-task request that ran in its caller's thread on ferry's POSIX path, kept in this compact
// form so that its report (and the text of its reasons) is built only when someone asks for it.
// Its text is optional and absent for most requests, so that copying one (into its File's lane,
// into its future) copies no string (bench/NOTES.md).
struct SmallRoute {
  // User-provided, so that a route is made field by field: made implicitly, GCC cleared all of
  // it (280 B, `rep stos`) first, in every small request (bench/NOTES.md §45).
  SmallRoute() {}
  Op op = Op::kRead;
  std::uint64_t offset = 0;
  std::uint64_t requested = 0;
  std::uint64_t bytes = 0;
  std::uint64_t nanoseconds = 0;
  cuda::QuickMemory memory;
  Settings settings;                            // the request's snapshot
  ReasonCode layer1 = ReasonCode::kHostBuffer;  // ferry's choice of its POSIX path
  // For kCufileCompatOnly: why cuFile could not help (GPU requests only).
  std::optional<std::string> compat_why;
  bool cold_direct = false;   // read with O_DIRECT because its pages were not cached
  bool cold_refused = false;  // cold, but the file system refused O_DIRECT
  // Measured for reads of at least the POSIX path's cold_task_min(); absent: not measured.
  std::optional<PageCacheResidency> page_cache;
  const HostPath* host = nullptr;  // the path that ran it (its runtime's environment's)
};

class RuntimeState;

class OpenFile {
 public:
  // `runtime`: the one its requests run on (FileOptions::runtime's, or the default one, which
  // backends/default_runtime.h names). `io`: the system calls on this file; null: the runtime's
  // environment's.
  OpenFile(const std::filesystem::path& path, std::string_view mode, FileOptions options,
           RuntimeState& runtime, io::IoSeam* io = nullptr);
  ~OpenFile();
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;

  const std::string& path() const { return path_; }
  io::IoSeam& io() const { return io_; }
  // The workers and staging memory of this File's requests.
  RuntimeState& runtime() const { return *runtime_; }
  int fd() const { return fd_; }
  // An http://, https:// or s3:// object, read through its runtime's remote seam.
  bool remote() const { return remote_; }
  // The O_DIRECT descriptor, or -1 when direct I/O was not asked for or was refused.
  int direct_fd() const { return direct_fd_; }
  bool direct_requested() const { return options_.direct; }
  // FileOptions::write_behind: buffered writes start their pages' writeback as they go.
  bool write_behind() const { return options_.write_behind; }
  // An O_DIRECT descriptor for reading cold ranges, opened on first use and kept until close():
  // the File's own O_DIRECT descriptor where it has one; -1 when the file system refuses
  // O_DIRECT or the file is not readable.
  int cold_direct_fd();
  // Why cold_direct_fd() could not open O_DIRECT (empty while it could, or was not asked).
  std::string cold_direct_refused() const;
  // Why O_DIRECT was refused (empty when it was not).
  const std::string& direct_refused() const { return direct_refused_; }
  // Requests register while they run, so close() can wait for them: closing a descriptor under
  // a running request would let a reused descriptor number send its I/O to another file.
  // begin_request() throws IoError (EBADF) once the file is closed or closing, except in a thread
  // that holds a RequestHold on this file (the request is part of the held one).
  void begin_request(const char* op);
  void end_request();
  // The same for a request that begins and ends in the calling thread (the small path): it
  // counts in the thread's lane, a cache line that other threads' requests do not write.
  // Returns the lane that end_small() takes, or null (nothing counted) once the file is closing.
  class Lane;
  Lane* begin_small();
  void end_small(Lane* lane);
  // In a child made by fork(): the parent's requests in flight will never end here; forget them
  // and the locks their threads may have held. Called by the fork handler only.
  void forget_parent_requests();
  bool readable() const { return readable_; }
  bool writable() const { return writable_; }
  // Mode "a": every write goes to the end of the file, whatever offset it names.
  bool appends() const { return appends_; }
  // Reserves `size` bytes at the end of the file for one append and returns their offset: the
  // larger of the file's size and the end of the last reservation, so appends from several
  // threads get disjoint ranges in the order they reserve. The caller holds a request of this
  // file (RequestHold) across the reservation and the write. Across Files and processes: the
  // first reservation takes an OFD write lock over the whole file (fcntl F_OFD_SETLKW, waiting
  // for other Files' appends to end), released when this File has no request left, so the size
  // another File reads is the end of every append written before. Throws IoError (fstat, fcntl).
  std::uint64_t reserve_append(std::size_t size);
  // The File's own values replace a malformed variable of the same setting.
  // Its runtime's settings (Environment::settings), given the File's overrides.
  Settings settings() const;
  // Current size from fstat; throws IoError.
  std::uint64_t size() const;
  // Refuses new requests, waits for those running, then closes the descriptors. Throws IoError
  // when close(2) fails (a write lost at close, as NFS can report), after closing them all.
  // Any thread may call it, any number of times.
  void close();
  // close() has begun: requests are refused.
  bool closed() const { return (requests_.load(std::memory_order_acquire) & kClosing) != 0; }

  void set_last_route(const RouteReport& report);
  // A small request's route, kept in the lane of the thread that ran it: last_route() reports
  // the one that ended last, whichever lane holds it. `ended_ns`: steady clock, when it ended.
  void set_last_route(Lane* lane, const SmallRoute& route, std::uint64_t ended_ns);
  RouteReport last_route() const;

  // State a backend attaches on first use (cuFile's O_DIRECT descriptor and registered handle):
  // made once by `make`, dropped by close(). Requests keep their own reference, so close()
  // never frees it under them. Null once the file is closed.
  std::shared_ptr<void> attachment(const std::function<std::shared_ptr<void>()>& make);

 private:
  std::string path_;
  FileOptions options_;
  io::IoSeam& io_;
  RuntimeState* runtime_;
  bool remote_ = false;
  bool attached_ = false;  // to runtime_, until close()
  int fd_ = -1;
  int direct_fd_ = -1;
  int cold_fd_ = -1;          // opened by cold_direct_fd()
  bool cold_tried_ = false;   // under attachment_mu_
  std::string cold_refused_;  // under attachment_mu_
  std::string direct_refused_;
  bool readable_ = false;
  bool writable_ = false;
  bool appends_ = false;
  std::mutex append_mu_;
  std::mutex close_mu_;
  std::uint64_t append_end_ = 0;  // under append_mu_
  bool append_locked_ = false;    // under append_mu_: this File holds the OFD append lock
  void release_append_lock_if_idle();
  // Requests in flight, with kClosing set once close() began: one atomic operation per request.
  // The fields written by every request sit on cache lines of their own, away from those that
  // requests only read (descriptors, path, settings).
  static constexpr std::uint64_t kClosing = std::uint64_t{1} << 63;
  alignas(64) std::atomic<std::uint64_t> requests_{0};
  std::mutex idle_mu_;  // for idle_ only
  std::condition_variable idle_;
  alignas(64) mutable std::mutex route_mu_;
  RouteReport last_route_;
  std::uint64_t last_route_ns_ = 0;  // when it ended (steady clock)
  // Small requests count and keep their route in their thread's lane (threads are dealt lanes
  // in turn; two threads may share one). With all of them on requests_ and route_mu_, 4 KiB
  // reads from 8 threads on one File ran at 0.66 to 0.78x pread's rate on an H200, where 8
  // Files reached 0.94 to 1.24x (bench/NOTES.md §25).
  static constexpr std::size_t kLanes = 16;
  std::unique_ptr<Lane[]> lanes_;
  bool idle() const;  // no request counted, in requests_ or any lane
  mutable std::mutex attachment_mu_;
  std::shared_ptr<void> attachment_;
};

// A registration that spans several steps of one call (an append reserves its range, then
// writes it): requests this thread begins on the same file while the hold lives are admitted even
// once close() has begun, since close() waits for the hold anyway. Without it, a close between
// the reservation and the write refused the write and left a hole of zeros under a later append.
class RequestHold {
 public:
  RequestHold(OpenFile& file, const char* op);
  ~RequestHold();
  RequestHold(const RequestHold&) = delete;
  RequestHold& operator=(const RequestHold&) = delete;
  // The file this thread holds, or null.
  static const OpenFile* held();

 private:
  OpenFile& file_;
  const OpenFile* previous_;
};

}  // namespace ferry::core
