// Issue 46: one plan. Over compat x require x memory x size-vs-threshold x remote x compat-only x
// resident x probe, ferry::explain, ferry::plan (over a file not yet named: local rows) and a real
// request, each on the runtime of the libcufile double, agree on the path, the rule (the first
// reason's code) and the refusal. A row that disagrees is named in full. Remote rows read the
// same bytes from the test HTTP server.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>
#include <string>
#include <vector>

#include "fake_cufile_env.h"
#include "ferry/error.h"
#include "ferry/explain.h"
#include "ferry/plan.h"
#include "ferry/remote.h"
#include "http_server.h"

namespace ferry {
namespace {

using test::DataFile;
using test::kMiB;

struct Case {
  CompatMode compat;
  Require require;
  bool gpu;
  std::size_t size;  // 8 KiB is below gds_threshold (16 KiB), 1 MiB above
  bool remote;       // the file is read by URL from the test HTTP server
  bool compat_only;  // no nvidia-fs in the machine's facts: cuFile could only use compat
  bool resident;     // the page cache holds the range
  bool probe_fails;  // cuFileHandleRegister fails (5027)

  std::string name() const {
    return fmt::format(
        "compat={} require={} gpu={} size={} remote={} compat_only={} resident={} probe_fails={}",
        to_string(compat), to_string(require), gpu, size, remote, compat_only, resident,
        probe_fails);
  }
};

std::vector<Case> every_case(bool remote) {
  std::vector<Case> out;
  for (CompatMode compat : {CompatMode::kAuto, CompatMode::kOn, CompatMode::kOff})
    for (Require require : {Require::kAny, Require::kCufile, Require::kGds})
      for (bool gpu : {false, true})
        for (std::size_t size : {std::size_t{8} << 10, std::size_t{1} << 20})
          for (bool compat_only : {false, true})
            for (bool resident : {false, true})
              for (bool probe_fails : {false, true})
                out.push_back(
                    {compat, require, gpu, size, remote, compat_only, resident, probe_fails});
  return out;
}

// The machine of the case: the double and the facts the cuFile path and the page cache give.
void set_machine(const Case& c) {
  test::FakeMachine& m = test::FakeMachine::get();
  m.host_as_gpu(c.gpu);
  m.set_root(test::test_data() / (c.compat_only ? "platform/nvfs_absent" : "platform/nvfs_rw_off"));
  m.set_resident_fraction(c.resident ? 1.0 : 0.0);
  if (c.probe_fails) {
    setenv("FERRY_FAKE_CUFILE_HANDLE_ERROR", "5027", 1);
  } else {
    unsetenv("FERRY_FAKE_CUFILE_HANDLE_ERROR");
  }
}

struct Outcome {
  Path path = Path::kPosix;
  std::string rule = "-";  // the first reason's code; "-" for none (cuFile)
  std::string refusal;     // empty: the request stands at layer 1

  std::string text() const {
    return fmt::format("path={} rule={} refusal=\"{}\"", to_string(path), rule, refusal);
  }
};

// ferry::explain's view. The buffer is host memory (the double reads into it; layer 1 sees it as
// the case says), as explain --host chooses it. Its failure on ferry's POSIX path is layer 1's
// refusal; on the cuFile path it is layer 2's, which the request meets after its I/O.
Outcome predict(const std::string& path, const Case& c) {
  ExplainRequest r;
  r.host = true;
  r.size = c.size;
  r.settings = test::with(4 * kMiB, c.compat, c.require);
  r.runtime = test::fake_gpu_runtime();
  const Explanation e = explain(path, r);
  Outcome o;
  o.path = e.path;
  if (!e.reasons.empty()) o.rule = to_string(e.reasons[0].code);
  if (e.path == Path::kPosix) o.refusal = e.failure.value_or("");
  return o;
}

// ferry::plan's view: a file not yet named (cold, the machine's cuFile outlook), its probe
// answered as the double will answer it. Compared on cold rows, the refusal by presence only:
// the probe's own words are the file's.
Outcome predict_unnamed(const Case& c) {
  PlanRequest r;
  r.size = c.size;
  r.host = true;
  r.settings = test::with(4 * kMiB, c.compat, c.require);
  r.runtime = test::fake_gpu_runtime();
  r.cufile_probe = c.probe_fails ? std::optional<std::string>("5027") : std::nullopt;
  const Plan p = plan(r);
  Outcome o;
  o.path = p.path;
  if (!p.reasons.empty()) o.rule = to_string(p.reasons[0].code);
  o.refusal = p.failure ? "refused" : "";
  return o;
}

Outcome request(const std::string& path, const Case& c) {
  std::vector<unsigned char> buf(c.size);
  File file(path, "r",
            {false, test::with(4 * kMiB, c.compat, c.require), test::fake_gpu_runtime()});
  Outcome o;
  IoFuture future = file.pread(buf.data(), c.size, 0);
  try {
    future.get();
  } catch (const RouteError& e) {
    o.refusal = e.what();
  }
  // require=gds refuses cuFile's compatibility pieces after the I/O (layer 2, which the double
  // always takes): at layer 1 the request went to cuFile and stood.
  const bool layer2 = o.refusal.rfind("require=gds refuses cuFile's non", 0) == 0 ||
                      o.refusal.rfind("require=gds: cannot prove", 0) == 0;
  if (layer2) o.refusal.clear();
  const RouteReport r = future.route();
  o.path = r.cufile_tasks > 0 || layer2 ? Path::kCufile : Path::kPosix;
  if (!r.reasons.empty() && r.reasons[0].code != ReasonCode::kEngine)
    o.rule = to_string(r.reasons[0].code);
  return o;
}

TEST(PlanTable, PredictionAndRequestAgreeOnPathRuleAndRefusal) {
  test::use_fake_gds_machine();
  DataFile f(2 * kMiB);
  const std::vector<Case> cases = every_case(false);
  ASSERT_EQ(cases.size(), 3u * 3 * 2 * 2 * 2 * 2 * 2);
  std::set<std::string> rules;
  std::size_t refused = 0;
  for (const Case& c : cases) {
    set_machine(c);
    const Outcome real = request(f.path(), c);
    EXPECT_EQ(predict(f.path(), c).text(), real.text()) << c.name();
    if (!c.resident) {
      Outcome seen = real;
      if (!seen.refusal.empty()) seen.refusal = "refused";
      EXPECT_EQ(predict_unnamed(c).text(), seen.text()) << "ferry::plan's view, " << c.name();
    }
    // Host memory's rule is no_cuda_driver here, host_buffer on the GPU machine.
    rules.insert(real.rule == "no_cuda_driver" ? "host_buffer" : real.rule);
    refused += real.refusal.empty() ? 0 : 1;
  }
  // The table reaches every rule of layer 1 (remote_source aside: tests/remote) and refusals.
  EXPECT_EQ(rules,
            (std::set<std::string>{"-", "below_threshold", "compat_mode_on", "cufile_compat_only",
                                   "cufile_unavailable", "host_buffer", "page_cache_resident"}));
  EXPECT_GT(refused, 0u);
  unsetenv("FERRY_FAKE_CUFILE_HANDLE_ERROR");
}

// The remote rows: remote_source is the first rule, so the machine's cuFile facts, the page
// cache and the probe change nothing, and compat_mode=off (GPU memory) or require refuses.
// ferry::plan has no remote rows: the file it plans for is not named, and local.
TEST(PlanTable, RemoteRowsAgreeToo) {
  if (!remote_support().available) {
    GTEST_SKIP() << "remote sources unavailable: " << remote_support().description;
  }
  test::use_fake_gds_machine();
  DataFile f(2 * kMiB);
  test::HttpServer server(f.path().parent_path());
  const std::string url = server.url(f.path().filename().string());
  const std::vector<Case> cases = every_case(true);
  std::set<std::string> rules;
  std::size_t refused = 0;
  for (const Case& c : cases) {
    set_machine(c);
    const Outcome real = request(url, c);
    EXPECT_EQ(predict(url, c).text(), real.text()) << c.name();
    rules.insert(real.rule);
    const bool refuses = (c.compat == CompatMode::kOff && c.gpu) || c.require != Require::kAny;
    EXPECT_EQ(!real.refusal.empty(), refuses) << c.name() << ": " << real.text();
    refused += refuses;
  }
  EXPECT_EQ(rules, std::set<std::string>{"remote_source"});
  EXPECT_GT(refused, 0u);
  unsetenv("FERRY_FAKE_CUFILE_HANDLE_ERROR");
}

}  // namespace
}  // namespace ferry
