// The one place that knows every backend: ferry's POSIX path and cuFile, behind core's seam
// (core/paths.h). Both are leaked on purpose: pool threads may still use them while static
// destructors run at exit.
#include "core/paths.h"

#include "cufile/cufile_backend.h"
#include "cufile/cufile_file.h"
#include "cufile/cufile_outlook.h"
#include "cufile/cufile_stats.h"
#include "cufile/cufile_testing.h"
#include "io/page_cache.h"
#include "posix/posix_backend.h"

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
  CufileWindow(Op op, int device) : observation_(cufile::Observation::begin(op, device)) {}
  void end(CufileCounts& out) override { observation_->end(out); }

 private:
  std::unique_ptr<cufile::Observation> observation_;
};

class CufilePath final : public AcceleratedPath {
 public:
  std::optional<std::string> compat_only(int fd) const override {
    cufile::Outlook outlook = cufile::accelerated_outlook(fd);
    if (outlook.accelerated) return std::nullopt;
    return std::move(outlook.why_not);
  }
  AcceleratedProbe probe(OpenFile& file, const Settings& settings) const override {
    cufile::Probe p = cufile::probe(file, settings);
    AcceleratedProbe out;
    if (p.state) out.backend = std::make_shared<cufile::CufileBackend>(std::move(p.state));
    out.why_not = std::move(p.why_not);
    out.compat_refused = p.compat_refused;
    return out;
  }
  std::unique_ptr<Layer2Window> observe(Op op, int device) const override {
    return std::make_unique<CufileWindow>(op, device);
  }
  MemoryInfo route_view(const MemoryInfo& memory) const override {
    return cufile::testing::route_view(memory);
  }
  bool host_treated_as_gpu() const override { return cufile::testing::host_treated_as_gpu(); }
};

}  // namespace

HostPath& host_path() {
  static auto* path = new PosixPath;
  return *path;
}

const AcceleratedPath& accelerated_path() {
  static auto* path = new CufilePath;
  return *path;
}

}  // namespace ferry::core
