// ferry::File: an open file that reads into and writes from host or GPU memory. Requests are
// split into tasks of `task_size` run on a shared thread pool; each returns an IoFuture that
// yields the byte count and the request's route report. A File may be used by several threads
// at once; close() waits for the requests in flight, and a File must not be moved while other
// threads use it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ferry/route.h"
#include "ferry/settings.h"

namespace ferry {

namespace core {
class RequestState;
class OpenFile;
}  // namespace core
namespace test {
class FileTestHelper;
}  // namespace test

// The result of an asynchronous request. get() waits and returns the byte count, or throws
// the request's error (IoError, CudaError, RouteError). Destroying an IoFuture waits for the
// request, so a buffer is never written after its future is gone; except for a stream-ordered
// request (File::read_async), whose stream orders the buffer's use instead.
class IoFuture {
 public:
  IoFuture() = default;
  explicit IoFuture(std::shared_ptr<core::RequestState> state);
  ~IoFuture();
  IoFuture(IoFuture&&) noexcept = default;
  IoFuture& operator=(IoFuture&& other) noexcept;

  bool valid() const { return state_ != nullptr; }
  bool ready() const;
  void wait() const;
  // Waits at most `seconds`; true when the request is complete.
  bool wait_for(double seconds) const;
  // Bytes moved so far by finished tasks (for progress bars).
  std::uint64_t progress() const;
  std::size_t get() const;
  // The report, complete once ready(); waits.
  RouteReport route() const;
  // Asks the request to stop: tasks not yet started do not start, tasks in flight finish. The
  // request then completes with IoError(ECANCELED) whose bytes_done() is the prefix in place
  // (or normally, if every byte had moved by then). False when it had already completed.
  // Waiting stays the caller's business: the buffer may be written until ready().
  bool cancel();

 private:
  std::shared_ptr<core::RequestState> state_;
};

class Runtime;

// One piece of a gathered read (File::pread_gather): `size` bytes at `file_offset` into `buffer`.
struct ReadRange {
  std::uint64_t file_offset = 0;
  std::size_t size = 0;
  void* buffer = nullptr;
};

// One piece of a scattered write (File::pwrite_scatter): `size` bytes from `buffer` to
// `file_offset`.
struct WriteRange {
  std::uint64_t file_offset = 0;
  std::size_t size = 0;
  const void* buffer = nullptr;
};

// One piece of a gathered read into one buffer (File::pread_ranges): `size` bytes at
// `file_offset` into the buffer at `buffer_offset`. For File::pwrite_ranges: from the buffer at
// `buffer_offset` to `file_offset`.
struct ByteRange {
  std::uint64_t file_offset = 0;
  std::size_t size = 0;
  std::size_t buffer_offset = 0;
};

struct FileOptions {
  bool direct = false;        // O_DIRECT, falling back to buffered I/O with a reason.
  SettingsOverride settings;  // per-File overrides of the process-wide settings.
  // The workers and staging memory of this File's requests (ferry/runtime.h); null: the
  // process's default runtime. The runtime must outlive the File's close().
  Runtime* runtime = nullptr;
  // Write-behind, for a file that will be fsynced when written: each buffered write's pages are
  // sent on their way to the disk as soon as they are written (sync_file_range, without
  // waiting), so the disk works while later bytes are still coming and the fsync waits for the
  // last of them only. save_file/save_checkpoint (durable) and `ferry write` set it.
  bool write_behind = false;
  // Set from another thread while the File is being opened, it stops the open: a remote
  // object's requests and retry waits end soon after (within about a second), and the
  // constructor throws IoError ECANCELED. Null: the open runs to its end. Read during the
  // constructor only.
  const std::atomic<bool>* cancel = nullptr;
};

class File {
 public:
  // mode: "r" read, "r+" read/write, "w" write (create, truncate), "w+" read/write (create,
  // truncate), "a" write (create, keep contents; every write goes to the end of the file,
  // whatever offset it names, as with O_APPEND within this process).
  // Throws IoError naming the path.
  explicit File(const std::filesystem::path& path, std::string_view mode = "r",
                FileOptions options = {});
  File();
  ~File();
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Reads up to `size` bytes at `file_offset` into `buf` (host or GPU memory). Fewer bytes
  // only at end of file.
  IoFuture pread(void* buf, std::size_t size, std::uint64_t file_offset = 0);
  // Writes all `size` bytes or fails with IoError carrying the bytes that reached the file.
  IoFuture pwrite(const void* buf, std::size_t size, std::uint64_t file_offset = 0);
  // Stream-ordered: reads `size` bytes at `file_offset` into `buf` (GPU or host memory) after
  // the work queued on `stream` (a CUstream / cudaStream_t; nullptr is the legacy default
  // stream) before this call, and before the work queued on it after, without blocking the
  // caller or synchronising the stream. Into GPU memory, ferry's workers (a pool of their own)
  // read the file into pinned staging at once, and the stream itself copies each piece into
  // `buf` once it is staged (the copies and their waits are queued on it at the call); into host
  // memory, the stream hands the request to the workers once its earlier work has run and its
  // later work waits for the request. The future completes with the bytes or the error; a
  // failed or cancelled request releases the stream too, so the stream's later work then sees
  // whatever the buffer holds: check the future. Dropping the future does not wait: the buffer
  // must stay allocated until the stream has passed the read (free it with cudaFreeAsync on the
  // stream, or after synchronising it). Errors (no driver, a bad stream, require=cufile or gds
  // with GPU memory, which always takes ferry's POSIX path here) complete the future, before
  // any I/O.
  IoFuture read_async(void* buf, std::size_t size, std::uint64_t file_offset, void* stream);
  // The same for a write of `buf`: it reads the buffer after the stream's earlier work (GPU
  // memory: the stream copies it into staging, then the writes start), and the stream's later
  // work may change the buffer once that copy has run (host memory: once the write completes).
  IoFuture write_async(const void* buf, std::size_t size, std::uint64_t file_offset, void* stream);
  // Reads every range in one request (the tensors of a checkpoint, rows of a table): the ranges
  // are cut into tasks of at most task_size and run on the workers like one large read, with one
  // route report for all. Every range must lie inside the file, and every buffer must be memory
  // of one kind on one GPU; else IoError (ENXIO, EINVAL) naming the range, before any I/O. The
  // span is copied before this returns. get() returns the total bytes.
  IoFuture pread_gather(std::span<const ReadRange> ranges);
  // The same into one buffer of `buffer_size` bytes (rows of a table, embedding rows): ranges
  // that follow each other both in the file and in the buffer are coalesced into one run first.
  // A range outside the buffer is IoError(EINVAL) naming it, before any I/O. The report counts
  // the ranges and the runs.
  IoFuture pread_ranges(void* buffer, std::size_t buffer_size, std::span<const ByteRange> ranges);
  // Writes every range in one request (tensors of a checkpoint, rows of a table), cut into tasks
  // and run on the workers like one large write, with one route report. The ranges must not
  // overlap in the file (the file grows to the end of the last); every buffer must be memory of
  // one kind on one GPU; not in append mode: else IoError (EINVAL, EBADF) naming the ranges,
  // before any I/O. On failure, bytes_done counts the ranges in the order given, up to the first
  // byte not known to have reached the file. The span is copied before this returns. get()
  // returns the total bytes.
  IoFuture pwrite_scatter(std::span<const WriteRange> ranges);
  // The same from one buffer of `buffer_size` bytes, ranges adjacent both in the buffer and in
  // the file coalesced into one run first.
  IoFuture pwrite_ranges(const void* buffer, std::size_t buffer_size,
                         std::span<const ByteRange> ranges);
  std::size_t read(void* buf, std::size_t size, std::uint64_t file_offset = 0);
  std::size_t write(const void* buf, std::size_t size, std::uint64_t file_offset = 0);
  // Writes at the end of the file, in any writable mode. Appends from several threads on one File
  // get disjoint ranges, in the order they were called; appends by other processes (or other
  // Files) at the same time are not ordered with them.
  std::size_t append(const void* buf, std::size_t size);

  std::uint64_t size() const;
  // fsync: the bytes written so far are on stable storage when it returns. Throws IoError.
  void sync();
  bool is_open() const;
  // Refuses new requests, waits for the I/O of those in flight, then closes the file. Throws
  // IoError if close(2) fails (a write lost at close); the File is closed either way. Safe while
  // other threads use the File: their calls then fail with IoError (EBADF, "file is closed"),
  // while path() and last_route() keep answering.
  void close();
  const std::string& path() const;
  // The effective settings of this File's requests (process-wide ones plus overrides).
  Settings effective_settings() const;
  // The route of the last request this File completed.
  RouteReport last_route() const;

 private:
  // tests/test_hooks.h: a File on an I/O seam of the test's (faults, counters).
  friend class test::FileTestHelper;
  explicit File(std::shared_ptr<core::OpenFile> file);

  std::shared_ptr<core::OpenFile> file_;
};

}  // namespace ferry
