// The seam between the request engine and one way of moving bytes (ferry's POSIX path, cuFile).
// The engine splits a request into tasks and runs one Worker per pool job; a Worker moves the
// tasks it is given and may keep work in flight until finish(). Workers are used by one thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>

#include "core/open_file.h"
#include "core/task_splitter.h"
#include "ferry/memory.h"
#include "ferry/route.h"
#include "ferry/settings.h"

namespace ferry::core {

struct RequestContext {
  // A constructor, not aggregate initialisation: for that GCC cleared the whole context (152 B,
  // `rep stos`) before writing its fields, 27 instructions of every small request (bench/NOTES.md
  // §45).
  RequestContext(OpenFile& f, Op o, char* b, MemoryInfo&& m, const Settings& s,
                 const std::atomic<bool>& c, std::size_t w, const PageCacheResidency* r,
                 std::atomic<std::size_t>& d, std::atomic<bool>& cr)
      : file(f),
        op(o),
        buffer(b),
        memory(std::move(m)),
        settings(s),
        cancelled(c),
        workers(w),
        residency(r),
        direct_tasks(d),
        cold_refused(cr) {}
  OpenFile& file;
  Op op;
  char* buffer;  // host address or CUDA device address of the request's first byte
  MemoryInfo memory;
  Settings settings;
  const std::atomic<bool>& cancelled;  // set when another task failed: stop promptly
  std::size_t workers = 1;             // threads that run the request's tasks
  // Of the whole range, before the request (reads); null: not measured. A pointer, so that a
  // small request builds no strings for it (bench/NOTES.md §45).
  const PageCacheResidency* residency = nullptr;
  std::atomic<std::size_t>& direct_tasks;  // tasks a backend read with O_DIRECT because cold
  std::atomic<bool>& cold_refused;         // a cold task stayed buffered: the file refused O_DIRECT
  // A gathered read: tasks name ranges of the file that need not touch, into buffers that need
  // not be one allocation (buffer + task.buffer_offset is each task's address).
  bool gathered = false;
};

class Worker {
 public:
  virtual ~Worker() = default;
  // Moves one task. Reads return fewer bytes than task.size only at end of file. Throws
  // IoError (with the bytes this task moved before failing) or CudaError.
  virtual std::size_t run(const Task& task) = 0;
  // Moves `task` as run() does, told the task this worker runs next, whose first bytes it may
  // start to move meanwhile (a GPU copy overlapping the task's last write). Called only where
  // looks_ahead() is true; `next` then runs next on this worker, unless the request is
  // cancelled or fails first.
  virtual std::size_t run_then(const Task& task, const Task& /*next*/) { return run(task); }
  // Whether run_then helps: the engine then claims each task before the one in hand ends.
  virtual bool looks_ahead() const { return false; }
  // Completes whatever run() left in flight; throws like run().
  virtual void finish() {}
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::unique_ptr<Worker> make_worker(const RequestContext& context) = 0;
  // The most workers worth running for `context`; more only contend (default: no limit).
  virtual std::size_t max_workers(const RequestContext&) const { return SIZE_MAX; }
  // How this backend moves the bytes of `context`, in words, for the route report.
  virtual std::string describe(const RequestContext& context) const = 0;
};

}  // namespace ferry::core
