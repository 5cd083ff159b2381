#include "ferry/file.h"

#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include "core/open_file.h"
#include "core/request.h"
#include "ferry/error.h"
#include "ferry/route.h"
#include "io/io_seam.h"

namespace ferry {

IoFuture::IoFuture(std::shared_ptr<core::RequestState> state) : state_(std::move(state)) {}

IoFuture::~IoFuture() {
  if (state_ && !state_->stream_ordered()) state_->wait();
}

IoFuture& IoFuture::operator=(IoFuture&& other) noexcept {
  if (this != &other) {
    if (state_ && !state_->stream_ordered()) state_->wait();
    state_ = std::move(other.state_);
  }
  return *this;
}

namespace {
const core::RequestState& checked(const std::shared_ptr<core::RequestState>& s) {
  if (!s) throw Error("IoFuture has no request (default-constructed or moved from)");
  return *s;
}
}  // namespace

bool IoFuture::ready() const { return checked(state_).ready(); }
void IoFuture::wait() const { checked(state_).wait(); }
bool IoFuture::wait_for(double seconds) const { return checked(state_).wait_for(seconds); }
std::uint64_t IoFuture::progress() const { return checked(state_).progress(); }
std::size_t IoFuture::get() const { return checked(state_).get(); }
RouteReport IoFuture::route() const { return checked(state_).route(); }
bool IoFuture::cancel() {
  checked(state_);
  return state_->cancel();
}

File::File() = default;
// File(path, mode, options) is defined in src/backends/default_runtime.cc, where the default
// runtime is.
File::File(std::shared_ptr<core::OpenFile> file) : file_(std::move(file)) {}
File::~File() = default;
File::File(File&&) noexcept = default;
File& File::operator=(File&&) noexcept = default;

namespace {
core::OpenFile& open_or_throw(const std::shared_ptr<core::OpenFile>& f, const char* op) {
  if (!f) throw IoError(EBADF, op, "<no file>", 0, 0, 0, "File is not open");
  return *f;
}

// Holds a File's descriptors open for one call: close() waits for it (a descriptor number freed
// under fstat or fsync could belong to another file by then).
struct InUse {
  core::OpenFile& f;
  InUse(core::OpenFile& file, const char* op) : f(file) { f.begin_request(op); }
  ~InUse() { f.end_request(); }
};

// Mode "a": a write goes to the end of the file, whatever offset it names (as with O_APPEND,
// which ferry cannot use: Linux appends every pwrite of such a descriptor, so the tasks of one
// request would land in the order they finish). The reservation and the request that writes it
// are one registration, so a concurrent close() cannot refuse the write after the reservation.
bool appends(const core::OpenFile& f) { return f.appends() && f.writable(); }

// run_sync() of a request of several tasks: apart, so that the one-task case saves no registers
// for a future (bench/NOTES.md §45).
[[gnu::noinline]] std::size_t run_submitted(const std::shared_ptr<core::OpenFile>& file, Op op,
                                            void* buf, std::size_t size, std::uint64_t offset) {
  return core::submit(file, op, buf, size, offset).get();
}

// core::submit(), apart from the small path's callers for the reason run_submitted() is.
[[gnu::noinline]] IoFuture submitted(const std::shared_ptr<core::OpenFile>& file, Op op, void* buf,
                                     std::size_t size, std::uint64_t offset) {
  return core::submit(file, op, buf, size, offset);
}

// A synchronous request: in the calling thread when it is one task (the caller waits for it
// anyway, whatever its size), else on the workers.
std::size_t run_sync(const std::shared_ptr<core::OpenFile>& file, Op op, void* buf,
                     std::size_t size, std::uint64_t offset) {
  std::size_t n = 0;
  if (core::run_small(*file, op, buf, size, offset, SIZE_MAX, &n)) return n;
  return run_submitted(file, op, buf, size, offset);
}
}  // namespace

IoFuture File::pread(void* buf, std::size_t size, std::uint64_t file_offset) {
  open_or_throw(file_, "pread");
  // One future, returned in place (a second, for the request that is not small, cost every small
  // one a move and a destructor: bench/NOTES.md §45).
  IoFuture future = core::submit_small(file_, Op::kRead, buf, size, file_offset, core::kSmallAsync);
  if (!future.valid()) future = submitted(file_, Op::kRead, buf, size, file_offset);
  return future;
}

IoFuture File::pwrite(const void* buf, std::size_t size, std::uint64_t file_offset) {
  core::OpenFile& f = open_or_throw(file_, "pwrite");
  std::optional<core::RequestHold> hold;
  try {
    if (appends(f)) {
      hold.emplace(f, "pwrite");
      file_offset = f.reserve_append(size);
    }
  } catch (const IoError&) {
    // Closed, or its size unreadable: submit() puts the error in the future, as for any request.
  }
  // The engine never writes through a write request's buffer.
  void* data = const_cast<void*>(buf);
  IoFuture small =
      core::submit_small(file_, Op::kWrite, data, size, file_offset, core::kSmallAsync);
  if (small.valid()) return small;
  return core::submit(file_, Op::kWrite, data, size, file_offset);
}

IoFuture File::read_async(void* buf, std::size_t size, std::uint64_t file_offset, void* stream) {
  open_or_throw(file_, "read_async");
  return core::submit_stream_ordered(file_, Op::kRead, buf, size, file_offset, stream);
}

IoFuture File::write_async(const void* buf, std::size_t size, std::uint64_t file_offset,
                           void* stream) {
  core::OpenFile& f = open_or_throw(file_, "write_async");
  std::optional<core::RequestHold> hold;
  try {
    if (appends(f)) {
      hold.emplace(f, "write_async");
      file_offset = f.reserve_append(size);
    }
  } catch (const IoError&) {
    // As pwrite: submit puts the error in the future.
  }
  return core::submit_stream_ordered(file_, Op::kWrite, const_cast<void*>(buf), size, file_offset,
                                     stream);
}

IoFuture File::pread_gather(std::span<const ReadRange> ranges) {
  open_or_throw(file_, "pread_gather");
  return core::submit_gather(file_, ranges);
}

namespace {

// The ranges of one buffer as runs for the engine: each checked against the buffer, ranges that
// follow each other both in the file and in the buffer coalesced into one.
std::vector<ReadRange> runs_of(const core::OpenFile& f, const char* op, const void* buffer,
                               std::size_t buffer_size, std::span<const ByteRange> ranges) {
  std::vector<ReadRange> runs;
  runs.reserve(ranges.size());
  char* base = static_cast<char*>(const_cast<void*>(buffer));
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const ByteRange& r = ranges[i];
    if (r.size == 0) continue;
    if (r.buffer_offset > buffer_size || r.size > buffer_size - r.buffer_offset) {
      throw IoError(EINVAL, op, f.path(), r.file_offset, r.size, 0,
                    "range " + std::to_string(i) + " is buffer bytes [" +
                        std::to_string(r.buffer_offset) + ", " +
                        std::to_string(r.buffer_offset + r.size) + "), outside the buffer of " +
                        std::to_string(buffer_size) + " B");
    }
    if (base == nullptr)
      throw IoError(EFAULT, op, f.path(), r.file_offset, r.size, 0, "null buffer");
    ReadRange* last = runs.empty() ? nullptr : &runs.back();
    if (last != nullptr && last->file_offset + last->size == r.file_offset &&
        static_cast<char*>(last->buffer) + last->size == base + r.buffer_offset) {
      last->size += r.size;  // adjacent in the file and in the buffer: one run
    } else {
      runs.push_back({r.file_offset, r.size, base + r.buffer_offset});
    }
  }
  return runs;
}

// A scattered write names its offsets: in append mode every write goes to the end instead.
void refuse_append(const core::OpenFile& f, const char* op) {
  if (appends(f)) {
    throw IoError(EBADF, op, f.path(), 0, 0, 0,
                  "a scattered write names its file offsets: not in append mode (\"a\")");
  }
}

}  // namespace

IoFuture File::pread_ranges(void* buffer, std::size_t buffer_size,
                            std::span<const ByteRange> ranges) {
  core::OpenFile& f = open_or_throw(file_, "pread_ranges");
  std::vector<ReadRange> runs = runs_of(f, "pread_ranges", buffer, buffer_size, ranges);
  return core::submit_gather(file_, runs, buffer, ranges.size());
}

IoFuture File::pwrite_scatter(std::span<const WriteRange> ranges) {
  core::OpenFile& f = open_or_throw(file_, "pwrite_scatter");
  refuse_append(f, "pwrite_scatter");
  // The engine never writes through a write request's buffers.
  std::vector<ReadRange> runs;
  runs.reserve(ranges.size());
  for (const WriteRange& r : ranges) {
    runs.push_back({r.file_offset, r.size, const_cast<void*>(r.buffer)});
  }
  return core::submit_gather(file_, runs, nullptr, 0, Op::kWrite);
}

IoFuture File::pwrite_ranges(const void* buffer, std::size_t buffer_size,
                             std::span<const ByteRange> ranges) {
  core::OpenFile& f = open_or_throw(file_, "pwrite_ranges");
  refuse_append(f, "pwrite_ranges");
  std::vector<ReadRange> runs = runs_of(f, "pwrite_ranges", buffer, buffer_size, ranges);
  return core::submit_gather(file_, runs, buffer, ranges.size(), Op::kWrite);
}

std::size_t File::read(void* buf, std::size_t size, std::uint64_t file_offset) {
  open_or_throw(file_, "pread");
  return run_sync(file_, Op::kRead, buf, size, file_offset);
}

std::size_t File::write(const void* buf, std::size_t size, std::uint64_t file_offset) {
  core::OpenFile& f = open_or_throw(file_, "pwrite");
  if (!appends(f)) return run_sync(file_, Op::kWrite, const_cast<void*>(buf), size, file_offset);
  core::RequestHold hold(f, "pwrite");
  return run_sync(file_, Op::kWrite, const_cast<void*>(buf), size, f.reserve_append(size));
}

std::size_t File::append(const void* buf, std::size_t size) {
  core::OpenFile& f = open_or_throw(file_, "append");
  core::RequestHold hold(f, "pwrite");
  return run_sync(file_, Op::kWrite, const_cast<void*>(buf), size, f.reserve_append(size));
}

std::uint64_t File::size() const {
  core::OpenFile& f = open_or_throw(file_, "fstat");
  InUse in_use(f, "fstat");
  return f.size();
}
void File::sync() {
  core::OpenFile& f = open_or_throw(file_, "fsync");
  InUse in_use(f, "fsync");
  if (f.io().fsync(f.fd()) != 0) throw IoError(errno, "fsync", f.path(), 0, 0);
}

bool File::is_open() const { return file_ && !file_->closed(); }

// The File keeps its state after close(): other threads may still be calling it (and get EBADF
// "file is closed"), and path() and last_route() still answer.
void File::close() {
  if (file_) file_->close();
}

const std::string& File::path() const { return open_or_throw(file_, "path").path(); }
Settings File::effective_settings() const { return open_or_throw(file_, "settings").settings(); }
RouteReport File::last_route() const { return open_or_throw(file_, "last_route").last_route(); }

}  // namespace ferry
