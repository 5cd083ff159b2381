// Runs one request: decides its route, splits it into tasks, runs workers on the thread pool
// and completes an IoFuture with the byte count, the error and the route report.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>

#include "core/open_file.h"
#include "ferry/file.h"
#include "ferry/route.h"

namespace ferry::core {

// Moves by one in every child made by fork() (a pthread_atfork handler): a request made under an
// older generation was the parent's. One relaxed load to read.
inline std::atomic<std::uint32_t> fork_generation{0};

class RequestState {
 public:
  // User-provided, so that make_shared does not zero the whole object before constructing it:
  // every member that is read before complete() has an initializer.
  RequestState() {}
  void complete(std::size_t bytes, std::exception_ptr error, RouteReport report);
  // Completes a small request that ran in its caller's thread, before the state is shared (no
  // lock, nobody to wake): its report is built when asked, from small_route() and the file's path
  // (a copy: a reference to the File would be a count that every thread's requests contend for,
  // issue 30).
  void complete_unshared(std::size_t bytes, const std::string& path);
  // Where a small request keeps its route while it runs (before the state is shared), so that
  // its future's report needs no copy of it (bench/NOTES.md §45).
  SmallRoute& small_route() { return small_.emplace(); }
  bool ready() const;
  void wait() const;
  bool wait_for(double seconds) const;
  void add_progress(std::uint64_t bytes) { progress_.fetch_add(bytes, std::memory_order_relaxed); }
  std::uint64_t progress() const { return progress_.load(std::memory_order_relaxed); }
  std::size_t get() const;  // waits; rethrows the error
  RouteReport route() const;
  // Asks the request to stop: false when it had already completed. The flag is the one its
  // tasks watch (a failed task sets it too), so no task starts after it is set.
  bool cancel();
  std::atomic<bool>& stop_flag() { return stop_; }
  bool cancel_requested() const { return cancel_requested_.load(std::memory_order_relaxed); }
  // A stream-ordered request (File::read_async): its IoFuture does not wait when destroyed, the
  // stream being what orders the buffer's use.
  void set_stream_ordered() { stream_ordered_ = true; }
  bool stream_ordered() const { return stream_ordered_; }
  // What wait() and get() run first, in the waiting thread: for a request of one task that no
  // worker has started yet, that task (the wait would otherwise pay two thread wake-ups). Set
  // before the future is handed out.
  void set_helper(std::function<void()> helper) { helper_ = std::move(helper); }
  // Made by the parent before fork() and not complete then: no thread of this process will ever
  // complete it (the parent's workers do not exist here, and the child's runtimes forget their
  // queues). Every wait returns at once, get() throws, cancel() has nothing to stop. The child
  // has one thread at fork(), so reading done_ without the lock is safe in it.
  bool orphaned() const {
    return generation_ != fork_generation.load(std::memory_order_relaxed) &&
           !finished_.load(std::memory_order_acquire);
  }

 private:
  [[noreturn]] void throw_orphaned() const;
  std::uint32_t generation_ = fork_generation.load(std::memory_order_relaxed);
  std::atomic<std::uint64_t> progress_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> cancel_requested_{false};
  bool stream_ordered_ = false;   // set before the future is handed out
  std::function<void()> helper_;  // likewise
  mutable std::mutex mu_;
  // Made by the first wait that must block, under mu_: most futures (a small request's, born
  // finished) never wait, and making and destroying one was 30 of their instructions
  // (bench/NOTES.md, "Small requests on one thread, round 2").
  mutable std::optional<std::condition_variable> cv_;
  bool done_ = false;  // under mu_
  // Set (release) once the result below is complete and will not change: waits that find it
  // read the result without the lock.
  std::atomic<bool> finished_{false};
  std::size_t bytes_ = 0;
  std::exception_ptr error_;
  // Apart, so that the state of a small request (which never has one) stays small enough for
  // malloc's per-thread cache (glibc's tcache: up to 1032 B; with the report inline the state
  // was larger and every future paid malloc's slow path, bench/NOTES.md §30).
  std::unique_ptr<const RouteReport> report_;
  // A small request's route (small_route()) and, set by complete_unshared(), its File's path,
  // inline where it fits, so that a small request's future allocates its state alone (a copy in
  // a std::string was a second allocation and its free, 170 instructions, bench/NOTES.md); longer
  // paths in small_path_.
  std::optional<SmallRoute> small_;
  std::string small_path_;
  std::uint16_t small_path_size_ = 0;
  char small_path_inline_[160];
};

// A new request state, from the calling thread's spares where it has one: a small request's
// future made and freed one (make_shared's malloc and free) in every request (bench/NOTES.md
// §45). A thread keeps at most a few spares, freed when it exits.
std::shared_ptr<RequestState> make_request_state();

// Starts the request. Errors found before any I/O (bad range, strict mode) complete the future
// with that error at once.
IoFuture submit(std::shared_ptr<OpenFile> file, Op op, void* buffer, std::size_t size,
                std::uint64_t offset);

// Starts a stream-ordered request on `stream` (cuda/stream_order.h): never in the caller's
// thread; the caller is not blocked and the stream is not synchronised.
IoFuture submit_stream_ordered(std::shared_ptr<OpenFile> file, Op op, void* buffer,
                               std::size_t size, std::uint64_t offset, void* stream);

// Starts a gathered read (or, with op = kWrite, a scattered write from the ranges' buffers):
// every range in one request, its tasks cut from each range. The ranges are checked (a read's
// inside the file, a write's not overlapping each other; one kind of memory) before any I/O and
// copied: the caller's span may go once this returns.
// `one_buffer`: every range reads into (writes from) that one allocation (classified once);
// `ranges_given`: how many ranges the caller named before adjacent ones were coalesced (for the
// report).
IoFuture submit_gather(std::shared_ptr<OpenFile> file, std::span<const ReadRange> ranges,
                       const void* one_buffer = nullptr, std::size_t ranges_given = 0,
                       Op op = Op::kRead);

// Small requests run in the caller's thread, without a hand-off to the workers, a future, a
// heap allocation or the text of a report: a request qualifies when it is one task of at most
// `max_size` bytes into or from host memory, on a buffered File, in a mode that allows ferry's
// POSIX path. Returns false, having done nothing, when the request does not qualify (the caller
// then submits it); else the byte count in *bytes, or throws the request's error.
bool run_small(OpenFile& file, Op op, void* buffer, std::size_t size, std::uint64_t offset,
               std::size_t max_size, std::size_t* bytes);
// The same for an asynchronous request: a completed future, or an invalid one when the request
// does not qualify. Errors complete the future.
IoFuture submit_small(const std::shared_ptr<OpenFile>& file, Op op, void* buffer, std::size_t size,
                      std::uint64_t offset, std::size_t max_size);

// The full report of a small request, as submit() would have made it. `cold_refused`: why the
// file refused O_DIRECT, where route.cold_refused (OpenFile::cold_direct_refused()).
RouteReport small_report(const std::string& path, const SmallRoute& route,
                         const std::string& cold_refused = {});

// Small asynchronous requests up to this size run in the caller's thread: a hand-off to a worker
// costs more than the read (bench/NOTES.md §12).
constexpr std::size_t kSmallAsync = std::size_t{64} << 10;

}  // namespace ferry::core
