// Runtimes on environments of the tests' own (src/core/paths.h), for tests that must not depend
// on what the machine's page cache holds: residency_runtime()'s Files measure page-cache
// residency as set_resident_fraction() says. Everything else is the default environment's.
// TestAmbient: a runtime's own clock, settings or statistics, the process's where not overridden.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "backends/paths.h"
#include "core/paths.h"
#include "ferry/runtime.h"
#include "stats/stats_recorder.h"
#include "test_hooks.h"

namespace ferry::test {

// The process's clock, settings and statistics, for a test to override what it gives a runtime
// of its own (Environment::ambient).
class TestAmbient : public core::Ambient {
 public:
  core::Clock::time_point now() const override { return core::Clock::now(); }
  Settings settings(const SettingsOverride& file) const override { return settings_with(file); }
  void record_request(const RouteReport& report, bool failed) const override {
    statistics::record_request(report, failed);
  }
  void record_small_request(Op op, std::uint64_t bytes, std::uint64_t nanoseconds,
                            ReasonCode layer1, bool cold_direct, int device) const override {
    statistics::record_small_request(op, bytes, nanoseconds, layer1, cold_direct, device);
  }
  void note_request_started(std::uint64_t bytes) const override {
    statistics::note_request_started(bytes);
  }
  void note_request_ended(std::uint64_t bytes) const override {
    statistics::note_request_ended(bytes);
  }
};

// ferry's POSIX path, with the page-cache residency of every range it measures set by the test
// (method "test") where set. Thread-safe.
class ResidencyHost final : public core::HostPath {
 public:
  explicit ResidencyHost(core::HostPath& real) : real_(real) {}
  // nullopt: measured, as the real path does.
  void set_fraction(std::optional<double> f) { ppm_.store(f ? static_cast<long>(*f * 1e6) : -1); }

  std::unique_ptr<core::Worker> make_worker(const core::RequestContext& c) override {
    return real_.make_worker(c);
  }
  std::size_t max_workers(const core::RequestContext& c) const override {
    return real_.max_workers(c);
  }
  std::string describe(const core::RequestContext& c) const override { return real_.describe(c); }
  std::size_t run_inline(const core::RequestContext& c, const core::Task& t) const override {
    return real_.run_inline(c, t);
  }
  PageCacheResidency residency(int fd, std::uint64_t offset, std::uint64_t size) const override {
    const long ppm = ppm_.load();
    if (ppm < 0 || size == 0) return real_.residency(fd, offset, size);
    PageCacheResidency r;
    r.known = true;
    r.method = "test";
    r.bytes = size;
    r.resident = static_cast<std::uint64_t>(static_cast<double>(size) * (ppm / 1e6));
    return r;
  }
  std::uint64_t cold_task_min() const override { return real_.cold_task_min(); }
  std::string prepare_write(core::OpenFile& f, std::uint64_t offset,
                            std::uint64_t size) const override {
    return real_.prepare_write(f, offset, size);
  }
  std::string describe_inline(Op op, const MemoryInfo& memory,
                              const Settings& settings) const override {
    return real_.describe_inline(op, memory, settings);
  }

 private:
  core::HostPath& real_;
  std::atomic<long> ppm_{-1};
};

// The process's ResidencyHost (leaked: runtimes' workers outlive static destructors).
inline ResidencyHost& residency_host() {
  static auto* host = new ResidencyHost(*backends::default_environment().host);
  return *host;
}

// Every range residency_runtime()'s requests measure reports this fraction resident; nullopt:
// measured.
inline void set_resident_fraction(std::optional<double> f) { residency_host().set_fraction(f); }

// A runtime on the default environment but for residency_host().
inline Runtime* residency_runtime() {
  static auto* runtime = [] {
    core::Environment env = backends::default_environment();
    env.host = &residency_host();
    return RuntimeTestHelper::make(env).release();
  }();
  return runtime;
}

}  // namespace ferry::test
