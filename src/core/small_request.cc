// Small requests, run in the caller's thread (request.h: run_small, submit_small): the cheap part
// of a request's plan (its checks, its memory, layer 1 from the cheap facts), then its one task
// on ferry's POSIX path, inline.
#include <chrono>
#include <climits>
#include <string>

#include "core/job.h"
#include "core/paths.h"
#include "core/request.h"
#include "core/request_plan.h"
#include "core/runtime_state.h"
#include "cuda/quick_memory.h"
#include "ferry/error.h"

namespace ferry::core {

namespace {

constexpr const char* kSmallNotMeasured =
    "not measured: a read under 1 MiB is read buffered whatever its residency";

// Whether a request may take the small path, checked without side effects: `route` gets its
// settings (the rest of it is the caller's to fill).
bool small_settings(OpenFile& file, Op op, const void* buffer, std::size_t size,
                    std::uint64_t offset, std::size_t max_size, SmallRoute& route) {
  if (buffer == nullptr || size == 0 || size > max_size || file.direct_requested()) return false;
  if (offset > static_cast<std::uint64_t>(LLONG_MAX) ||
      size > static_cast<std::uint64_t>(LLONG_MAX) - offset) {
    return false;
  }
  if (op == Op::kRead ? !file.readable() : !file.writable()) return false;
  if (!file.runtime().env().layer1_sees_buffers_as_they_are()) return false;
  try {
    route.settings = file.settings();
  } catch (const Error&) {
    return false;  // submit() reports the bad setting
  }
  return size <= route.settings.task_size && route.settings.require == Require::kAny;
}

// Runs a qualifying request, whose `route` start_small() filled; `route` gets the rest of its
// compact report. Throws the request's error after recording it.
std::size_t run_small_now(OpenFile& file, OpenFile::Lane* lane, void* buffer, SmallRoute& route) {
  const Environment& env = file.runtime().env();
  const Clock::time_point start = env.now();
  const std::uint64_t offset = route.offset;
  const std::size_t size = route.requested;
  route.host = env.host;
  std::atomic<bool> cancelled{false};
  std::atomic<std::size_t> direct_tasks{0};
  std::atomic<bool> cold_refused{false};
  RequestContext context{file,
                         route.op,
                         static_cast<char*>(buffer),
                         {route.memory.kind, route.memory.device, {}},
                         route.settings,
                         cancelled,
                         1,
                         {},
                         direct_tasks,
                         cold_refused};
  std::size_t bytes = 0;
  env.note_request_started(size);
  try {
    if (route.op == Op::kRead && size >= route.host->cold_task_min()) {
      // Large enough for the cold rule: measure, as submit() does.
      const std::uint64_t file_size = file.size();
      const std::size_t effective =
          offset >= file_size ? 0 : std::min<std::uint64_t>(size, file_size - offset);
      route.page_cache = route.host->residency(file.fd(), offset, effective);
      context.residency = &*route.page_cache;
    }
    bytes = route.host->run_inline(context, Task{offset, 0, size});
  } catch (...) {
    route.cold_direct = direct_tasks.load() > 0;
    route.cold_refused = cold_refused.load();
    route.nanoseconds = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(env.now() - start).count());
    RouteReport report =
        small_report(file.path(), route, route.cold_refused ? file.cold_direct_refused() : "");
    env.record_request(report, true);
    env.note_request_ended(size);
    file.set_last_route(report);
    throw;
  }
  route.bytes = bytes;
  route.cold_direct = direct_tasks.load(std::memory_order_relaxed) > 0;
  route.cold_refused = cold_refused.load(std::memory_order_relaxed);
  route.nanoseconds = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(env.now() - start).count());
  // The same bucket record_request() picks: host memory, a GPU's, or a GPU not known.
  const cuda::QuickMemory& memory = route.memory;
  const int device = !is_gpu(memory.kind) ? -1
                     : memory.device >= 0 ? memory.device
                                          : statistics::kDeviceNotRecorded;
  env.end_small_request(route.op, bytes, route.nanoseconds, route.layer1, route.cold_direct, device,
                        size);
  const auto ended = start + std::chrono::nanoseconds(route.nanoseconds);
  file.set_last_route(
      lane, route,
      static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(ended.time_since_epoch()).count()));
  return bytes;
}

// The checks every small request makes before it runs, filling `route` with what it knows
// before the I/O; null (and nothing done) when it does not qualify or the file is closing
// (submit() reports that). Otherwise the request is counted in the returned lane, and the caller
// owes file.end_small(lane).
OpenFile::Lane* start_small(OpenFile& file, Op op, void* buffer, std::size_t size,
                            std::uint64_t offset, std::size_t max_size, SmallRoute& route) {
  if (!small_settings(file, op, buffer, size, offset, max_size, route)) return nullptr;
  route.op = op;
  route.offset = offset;
  route.requested = size;
  route.memory = cuda::classify_quick(buffer);
  // The plan's walk over the cheap facts: a remote object, cuFile, or a rule that needs the
  // residency or cuFile's driver, goes to submit().
  Layer1Walk walk = cheap_walk(route.settings, is_gpu(route.memory.kind), size, file);
  if (!walk.decided || walk.rule == Layer1Rule::kCufile || walk.rule == Layer1Rule::kRemoteSource) {
    return nullptr;
  }
  route.layer1 = reason_code(walk.rule, route.memory.noted());
  if (!walk.why.empty()) route.compat_why = std::move(walk.why);
  return file.begin_small();
}

}  // namespace

bool run_small(OpenFile& file, Op op, void* buffer, std::size_t size, std::uint64_t offset,
               std::size_t max_size, std::size_t* bytes) {
  SmallRoute route;
  OpenFile::Lane* lane = start_small(file, op, buffer, size, offset, max_size, route);
  if (lane == nullptr) return false;
  struct End {
    OpenFile& f;
    OpenFile::Lane* lane;
    ~End() { f.end_small(lane); }
  } end{file, lane};
  *bytes = run_small_now(file, lane, buffer, route);
  return true;
}

IoFuture submit_small(const std::shared_ptr<OpenFile>& file, Op op, void* buffer, std::size_t size,
                      std::uint64_t offset, std::size_t max_size) {
  // The state first, so that the route is made where the future keeps it; one that does not
  // qualify goes back to the thread's spares, where submit() finds it.
  auto state = make_request_state();
  SmallRoute& route = state->small_route();
  OpenFile::Lane* lane = start_small(*file, op, buffer, size, offset, max_size, route);
  if (lane == nullptr) return IoFuture();
  try {
    std::size_t bytes = run_small_now(*file, lane, buffer, route);
    file->end_small(lane);
    // Asynchronous small requests are at most 64 KiB: never cold (cold_task_min is 1 MiB), so
    // their report needs no word from the File beyond its path.
    state->complete_unshared(bytes, file->path());
  } catch (...) {
    file->end_small(lane);
    state->complete(
        0, std::current_exception(),
        small_report(file->path(), route, route.cold_refused ? file->cold_direct_refused() : ""));
  }
  return IoFuture(std::move(state));
}

RouteReport small_report(const std::string& path, const SmallRoute& r,
                         const std::string& cold_refused) {
  RouteReport report;
  report.op = r.op;
  report.file = path;
  report.memory = r.memory.kind;
  report.device = r.memory.device;
  report.offset = r.offset;
  report.requested = r.requested;
  report.bytes = r.bytes;
  report.tasks = 1;
  report.workers = 1;
  report.posix_tasks = 1;
  report.seconds = static_cast<double>(r.nanoseconds) / 1e9;
  if (r.page_cache) report.page_cache = *r.page_cache;
  if (!report.page_cache.known && report.page_cache.why_not.empty()) {
    report.page_cache.why_not = r.op == Op::kRead ? kSmallNotMeasured : "not measured for writes";
  }
  report.direct_tasks = r.cold_direct ? 1 : 0;
  const Settings& settings = r.settings;
  const MemoryInfo memory = cuda::with_note(r.memory);
  // The same plan, given the one fact the cheap walk used (it never needs the others).
  struct Replay final : Layer1Asks {
    explicit Replay(const SmallRoute& route) : r(route) {}
    std::optional<std::optional<std::string>> compat_only() override {
      if (r.layer1 == ReasonCode::kCufileCompatOnly)
        return std::optional(r.compat_why.value_or(std::string()));
      return std::optional<std::string>();
    }
    std::optional<bool> resident() override { return false; }
    std::optional<std::optional<std::string>> probe() override {
      return std::optional<std::string>("not probed");
    }
    const SmallRoute& r;
  } replay(r);
  report.reasons = plan_route(settings, memory, r.requested, replay, report.page_cache).reasons;
  // Small requests never run on a File's O_DIRECT descriptor (small_settings()).
  report.reasons.push_back({ReasonCode::kEngine, r.host->describe_inline(r.op, memory, settings)});
  if (r.cold_direct) report.reasons.push_back(cold_direct_reason(report));
  if (r.cold_refused) report.reasons.push_back({ReasonCode::kDirectIoRefused, cold_refused});
  report.cufile.why_not = "no request went to cuFile";
  return report;
}

}  // namespace ferry::core
