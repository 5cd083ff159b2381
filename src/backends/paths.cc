// The one place that knows every backend: ferry's POSIX path and cuFile, behind core's seam
// (core/paths.h), and the default environment made of them. Its objects are leaked on purpose:
// pool threads may still use them while static destructors run at exit.
#include "backends/paths.h"

#include <utility>

#include "cufile/cufile_backend.h"
#include "cufile/cufile_file.h"
#include "cufile/cufile_outlook.h"
#include "cufile/cufile_stats.h"
#include "io/page_cache.h"
#include "posix/posix_backend.h"
#include "remote/remote_seam.h"

namespace ferry::core {
namespace {

class PosixPath final : public HostPath {
 public:
  std::unique_ptr<Worker> make_worker(const RequestContext& context) override {
    return backend_.make_worker(context);
  }
  std::size_t max_workers(const RequestContext& context) const override {
    return backend_.max_workers(context);
  }
  std::string describe(const RequestContext& context) const override {
    return backend_.describe(context);
  }
  std::size_t run_inline(const RequestContext& context, const Task& task) const override {
    return backend_.run_inline(context, task);
  }
  PageCacheResidency residency(int fd, std::uint64_t offset, std::uint64_t size) const override {
    return io::measure_residency(fd, offset, size);
  }
  std::uint64_t cold_task_min() const override { return posix::kColdTaskMin; }
  std::string prepare_write(OpenFile& file, std::uint64_t offset,
                            std::uint64_t size) const override {
    return posix::preallocate_for_write(file, offset, size);
  }
  std::string describe_inline(Op op, const MemoryInfo& memory,
                              const Settings& settings) const override {
    return backend_.describe(op, memory, settings, false, 1);
  }

 private:
  posix::PosixBackend backend_;
};

class CufileWindow final : public Layer2Window {
 public:
  CufileWindow(Op op, int device, const cufile::Machine& machine)
      : observation_(cufile::Observation::begin(op, device, machine)) {}
  void end(CufileCounts& out) override { observation_->end(out); }

 private:
  std::unique_ptr<cufile::Observation> observation_;
};

class CufilePath final : public AcceleratedPath {
 public:
  explicit CufilePath(cufile::Machine machine) : machine_(std::move(machine)) {}
  std::optional<std::string> compat_only(int fd) const override {
    cufile::Outlook outlook = cufile::accelerated_outlook(fd, machine_.root);
    if (outlook.accelerated) return std::nullopt;
    return std::move(outlook.why_not);
  }
  AcceleratedProbe probe(OpenFile& file, const Settings& settings) const override {
    cufile::Probe p = cufile::probe(file, settings, machine_.root);
    AcceleratedProbe out;
    if (p.state) out.backend = std::make_shared<cufile::CufileBackend>(std::move(p.state));
    out.why_not = std::move(p.why_not);
    out.compat_refused = p.compat_refused;
    return out;
  }
  std::unique_ptr<Layer2Window> observe(Op op, int device) const override {
    return std::make_unique<CufileWindow>(op, device, machine_);
  }

 private:
  cufile::Machine machine_;
};

}  // namespace
}  // namespace ferry::core

namespace ferry::backends {

const core::Environment& default_environment() {
  // Process-wide: the default runtime's (default_runtime()); leaked, as that runtime is.
  static const core::Environment* env = [] {
    auto* e = new core::Environment;
    e->io = &io::system_io();
    e->remote = &remote::remote_objects();
    e->host = new core::PosixPath;
    e->accelerated = new core::CufilePath(cufile::Machine{});
    return e;
  }();
  return *env;
}

std::unique_ptr<core::AcceleratedPath> make_cufile_path(cufile::Machine machine) {
  return std::make_unique<core::CufilePath>(std::move(machine));
}

}  // namespace ferry::backends
