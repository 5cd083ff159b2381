// ferry check: the gdscheck equivalent. What this machine offers GPUDirect Storage, read without
// any I/O: GPUs, CUDA driver, libcufile, cufile.json, nvidia-fs, IOMMU, ACS, P2PDMA, ferry's
// settings, and one verdict per GPU in words.
#include <ferry/cufile.h>
#include <ferry/explain.h>
#include <ferry/plan.h>
#include <ferry/platform.h>
#include <ferry/remote.h>
#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common.h"

namespace ferry::cli {
namespace {

struct CheckArgs {
  std::string root = "/";
  std::string path = ".";
  bool json = false;
};

std::string cuda_version_text(int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); }

// The platform's GPUs with libcuda's names; GPUs libcuda sees but sysfs does not are added.
void merge_gpus(PlatformReport& p, const CudaStatus& cuda) {
  const std::string version =
      cuda.available ? cuda_version_text(cuda.driver_version) : std::string();
  for (const GpuInfo& g : cuda.gpus) {
    PlatformGpu* match = nullptr;
    for (auto& s : p.gpus)
      if (normalize_pci_bus_id(s.bus_id) == normalize_pci_bus_id(g.pci_bus_id)) match = &s;
    if (match == nullptr) {
      p.gpus.push_back(PlatformGpu{normalize_pci_bus_id(g.pci_bus_id), std::nullopt, std::nullopt,
                                   std::nullopt, std::nullopt});
      match = &p.gpus.back();
    }
    match->name = g.name;
    match->cuda_driver_version = version;
  }
}

// What ferry will do for GPU reads on this machine, in one sentence; `fails` is set when those
// reads would fail under these settings.
std::string verdict(const PlatformReport& p, const CudaStatus& cuda, const CufileStatus& c,
                    const Settings& s, bool& fails) {
  // cuFile's own path, judged as explain judges it, over the machine's facts (no file named).
  const Layer2Facts facts = layer2_facts(p, nullptr);
  const std::string gds =
      facts.blocking.empty()
          ? "available for files on ext4 (data=ordered) or xfs on NVMe; `ferry explain FILE` "
            "tells per file"
          : "not available (" + facts.blocking.front() + ")";
  std::string cufile;
  if (!c.loaded) {
    cufile = "cuFile is not usable (" + c.load_error + ")";
  } else if (c.driver_open_attempted && !c.driver_open) {
    cufile = "cuFile's driver does not open (" + c.driver_error_text + ")";
  } else if (!facts.blocking.empty()) {
    cufile = cufile_setting(p, "properties.allow_compat_mode") == "false"
                 ? "cuFile will refuse to run (allow_compat_mode is false)"
                 : "cuFile will run in compatibility mode";
  } else {
    cufile = fmt::format("cuFile {} is usable", c.version_text);
  }
  // A GPU read of gds_threshold bytes, planned as the engine plans it, with cuFile's probe
  // answered by its status (no file is named: its own facts decide the rest).
  std::string ferry;
  PlanRequest gpu_read;
  gpu_read.gpu = 0;
  gpu_read.size = s.gds_threshold;
  gpu_read.settings = {s.compat_mode, s.require,       s.task_size,          s.gds_threshold,
                       s.nthreads,    s.host_nthreads, s.bounce_buffer_size, s.host_load};
  const bool usable = c.loaded && !(c.driver_open_attempted && !c.driver_open);
  gpu_read.cufile_probe = usable ? std::optional<std::string>()
                                 : std::optional(c.loaded ? c.driver_error_text : c.load_error);
  const Plan plan_here = cuda.available ? plan(gpu_read) : Plan{};
  const std::string& required = plan_here.cufile_required_by;
  if (!cuda.available) {
    ferry = "ferry cannot use GPU memory (" + cuda.why_not +
            ") and reads into host memory through its POSIX path";
  } else if (plan_here.failure && !required.empty()) {
    fails = true;
    ferry = fmt::format("ferry will fail GPU reads ({} requires cuFile: {})", required,
                        *plan_here.failure);
  } else if (plan_here.failure) {
    fails = true;
    ferry = "ferry cannot read into GPU memory (" + *plan_here.failure + ")";
  } else if (plan_here.path == Path::kPosix) {
    ferry = "ferry will read into GPU memory through its own POSIX path, cuFile is not called: " +
            reasons_text(plan_here);
  } else if (!required.empty()) {
    ferry = fmt::format(
        "ferry will send GPU reads to cuFile ({}), failing where it cannot serve them", required);
  } else {
    ferry = fmt::format(
        "ferry will send GPU reads of {} or more to cuFile where the range is not in the page "
        "cache and cuFile can register the file (else its POSIX path, with the reason: "
        "`ferry explain FILE` tells per file)",
        format_size(s.gds_threshold));
  }
  return fmt::format("GDS accelerated path: {}; {}; {}", gds, cufile, ferry);
}

int run(const CheckArgs& a) {
  PlatformReport p = read_platform(a.root);
  const CudaStatus cuda = cuda_status();
  const CufileStatus cufile = cufile_status(true);
  const RemoteSupport remote = remote_support();
  // A malformed FERRY_* variable is what check is there to diagnose: report it, go on with the
  // default it leaves in place.
  const SettingsCheck checked = check_settings();
  const Settings& s = checked.settings;
  merge_gpus(p, cuda);
  std::error_code ec;
  if (!std::filesystem::exists(a.path, ec)) {
    // read_storage would describe the nearest existing parent (once: / for any missing path).
    throw IoError(ENOENT, "check", a.path, 0, 0, 0, "--path: no such file or directory");
  }
  const PlatformStorage storage = read_storage(a.path, p.gpus, a.root);
  const bool own_root = a.root != "/";
  const std::string process_note =
      own_root ? fmt::format("libcuda and libcufile are this process's, not {}'s", a.root) : "";
  std::vector<std::string> verdicts;
  bool gpu_reads_fail = false;
  std::string common = verdict(p, cuda, cufile, s, gpu_reads_fail);
  // As explain and plan do for the read they predict: the read `ferry read` makes by default
  // (into GPU 0 where the driver sees one) would fail, so the status says so after the report.
  const bool default_read_fails = gpu_reads_fail && cuda.available && !cuda.gpus.empty();
  // Measured on the GPU machine (device.md): containers and VMs without udev hit 5027.
  if (storage.udev_fs_usage == false)
    common += fmt::format("; files under {} cannot be registered with cuFile ({})", a.path,
                          storage.udev_reason);
  for (const auto& g : p.gpus)
    verdicts.push_back(
        fmt::format("GPU {}{}: {}", g.bus_id, g.name ? " (" + *g.name + ")" : "", common));
  if (p.gpus.empty()) {
    verdicts.push_back(
        fmt::format("no GPU visible ({}; {}): ferry reads into host memory through its POSIX path",
                    p.gpus_reason, cuda.available ? "the CUDA driver sees none" : cuda.why_not));
  }
  if (a.json) {
    nlohmann::json settings_json = nlohmann::json::array();
    for (const SettingInfo& i : describe_settings())
      settings_json.push_back({{"name", i.name},
                               {"env", i.env},
                               {"value", i.value},
                               {"source", to_string(i.source)},
                               {"source_env", i.source_env},
                               {"kvikio_env", i.kvikio_env},
                               {"error", i.error},
                               {"environment_only", i.environment_only}});
    nlohmann::json out = {
        {"platform", nlohmann::json::parse(platform_report_json(p, storage))},
        {"cuda",
         {{"available", cuda.available},
          {"why_not", cuda.why_not},
          {"driver_version", cuda.available ? nlohmann::json(cuda_version_text(cuda.driver_version))
                                            : nlohmann::json(nullptr)},
          {"gpus", cuda.gpus.size()}}},
        {"cufile", nlohmann::json::parse(cufile.to_json())},
        {"remote", {{"available", remote.available}, {"description", remote.description}}},
        {"settings", settings_json},
        {"verdicts", verdicts},
        {"process_note", process_note},
    };
    fmt::print("{}\n", out.dump(2));
    return checked.errors.empty() && !default_read_fails ? 0 : 1;
  }
  fmt::print("{}", format_platform_report(p, storage));
  auto line = [](std::string_view label, const std::string& value) {
    fmt::print("{:<37} {}\n", label, value);
  };
  line("cuda driver", cuda.available ? cuda_version_text(cuda.driver_version)
                                     : "no driver (" + cuda.why_not + ")");
  if (!cufile.loaded) {
    line("libcufile", "not usable: " + cufile.load_error);
  } else {
    line("libcufile", fmt::format("{} version {}", cufile.library, cufile.version_text));
    line("  driver",
         cufile.driver_open
             ? (cufile.compat_mode_refused ? "open (compatibility mode refused)" : "open")
             : "does not open: " + cufile.driver_error_text);
    line("  stats", cufile.stats_why_not.empty() ? "readable" : cufile.stats_why_not);
  }
  if (!cufile.missing_symbols.empty()) {
    std::string missing;
    for (const auto& m : cufile.missing_symbols) missing += (missing.empty() ? "" : ", ") + m;
    line("  missing symbols", missing);
  }
  line("remote sources (http, https, s3)",
       remote.available ? remote.description : "unavailable: " + remote.description);
  for (const SettingInfo& i : describe_settings()) {
    if (!i.error.empty()) {
      line("ferry " + i.name, fmt::format("{} ({})", i.value, i.error));
      continue;
    }
    line("ferry " + i.name,
         fmt::format("{} ({}{})", i.value, to_string(i.source),
                     i.source == SettingSource::kEnvironment ? " " + i.source_env : ""));
  }
  if (own_root) line("note", process_note);
  for (const auto& v : verdicts) fmt::print("verdict: {}\n", v);
  for (const SettingError& e : checked.errors)
    fmt::print(stderr, "ferry: check: {}; the value in its place is shown above\n", e.what());
  if (default_read_fails)
    fmt::print(stderr, "ferry: check: a read into GPU memory would fail (the verdict says why)\n");
  return checked.errors.empty() && !default_read_fails ? 0 : 1;
}

}  // namespace

void add_check_command(CLI::App& app, std::function<int()>& action) {
  auto args = std::make_shared<CheckArgs>();
  CLI::App* cmd = app.add_subcommand(
      "check", "Report what this machine offers GPUDirect Storage (gdscheck), without any I/O");
  cmd->add_option("--root", args->root,
                  "Read /proc, /sys and /etc under this directory instead of / (libcuda and "
                  "libcufile stay this process's)");
  cmd->add_option("--path", args->path,
                  "A file or directory whose storage (mount, udev entry, PCI distance) to check");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &action] { action = [args] { return run(*args); }; });
}

}  // namespace ferry::cli
