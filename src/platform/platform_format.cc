// The platform report as JSON (for tools and Python) and as text for people. Unknown values are
// JSON null with their reason beside them; the text says "unknown: <reason>".
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "ferry/platform.h"
#include "ferry/settings.h"
#include "platform/text_file.h"

namespace ferry {
namespace {

using nlohmann::json;

template <typename T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

json state_json(const PlatformState& s) { return {{"on", opt(s.on)}, {"how", s.how}}; }

json storage_json(const PlatformStorage& s) {
  json d = json::array();
  for (const auto& g : s.gpu_distances)
    d.push_back({{"gpu", g.gpu_bus_id}, {"distance", opt(g.distance)}, {"reason", g.reason}});
  return {{"file", s.file},
          {"mount_point", opt(s.mount_point)},
          {"fs_type", opt(s.fs_type)},
          {"mount_options", opt(s.mount_options)},
          {"super_options", opt(s.super_options)},
          {"source", opt(s.source)},
          {"device", opt(s.device)},
          {"mount_reason", s.mount_reason},
          {"statfs_type", opt(s.statfs_type)},
          {"udev_fs_usage", opt(s.udev_fs_usage)},
          {"udev_reason", s.udev_reason},
          {"pci_function", opt(s.pci_function)},
          {"pci_numa_node", opt(s.pci_numa_node)},
          {"pci_reason", s.pci_reason},
          {"gpu_distances", d}};
}

std::string yes_no(const std::optional<bool>& b, std::string_view yes = "yes",
                   std::string_view no = "no") {
  return b ? std::string(*b ? yes : no) : "unknown";
}

template <typename T>
std::string or_unknown(const std::optional<T>& v) {
  return v ? fmt::format("{}", *v) : "unknown";
}

}  // namespace

std::string platform_report_json(const PlatformReport& r,
                                 const std::optional<PlatformStorage>& storage) {
  json gpus = json::array();
  for (const auto& g : r.gpus)
    gpus.push_back({{"bus_id", g.bus_id},
                    {"numa_node", opt(g.numa_node)},
                    {"bar1_bytes", opt(g.bar1_bytes)},
                    {"name", opt(g.name)},
                    {"cuda_driver_version", opt(g.cuda_driver_version)}});
  json values = json::array();
  for (const auto& v : r.cufile.values)
    values.push_back(
        {{"key", v.key}, {"value", opt(v.value)}, {"source", v.source}, {"problem", v.problem}});
  const auto& n = r.nvfs;
  json out = {
      {"root", r.root},
      {"kernel_release", opt(r.kernel_release)},
      {"nvidia_driver",
       {{"version", opt(r.nvidia_driver_version)}, {"reason", r.nvidia_driver_reason}}},
      {"gpus", gpus},
      {"gpus_reason", r.gpus_reason},
      {"nvidia_fs",
       {{"loaded", n.loaded},
        {"reason", n.reason},
        {"version", opt(n.version)},
        {"devcount", opt(n.devcount)},
        {"storage_modules", n.storage_modules},
        {"nvme_registered", opt(n.nvme_registered)},
        {"rw_stats_enabled", opt(n.rw_stats_enabled)},
        {"reads_n", opt(n.reads_n)},
        {"reads_mib", opt(n.reads_mib)}}},
      {"cufile_json",
       {{"path", r.cufile.path},
        {"path_from_env", r.cufile.path_from_env},
        {"state", r.cufile.state},
        {"detail", r.cufile.detail},
        {"values", values},
        {"problems", r.cufile.problems},
        {"cufile_env", r.cufile.cufile_env}}},
      {"iommu", state_json(r.iommu)},
      {"acs", state_json(r.acs)},
      {"acs_bridges", r.acs_bridges},
      {"p2pdma", state_json(r.p2pdma)},
  };
  if (storage) out["storage"] = storage_json(*storage);
  // Invalid UTF-8 from a captured file must not make dump() throw.
  return out.dump(2, ' ', false, json::error_handler_t::replace);
}

std::string format_platform_report(const PlatformReport& r,
                                   const std::optional<PlatformStorage>& storage) {
  std::string o;
  auto line = [&](std::string_view label, const std::string& value) {
    o += fmt::format("{:<37} {}\n", label, value);
  };
  line("kernel", or_unknown(r.kernel_release));
  line("nvidia driver",
       r.nvidia_driver_version ? *r.nvidia_driver_version : "unknown: " + r.nvidia_driver_reason);
  line("gpus", r.gpus_reason);
  for (const auto& g : r.gpus)
    line("  " + g.bus_id,
         fmt::format("{}numa {} bar1 {}{}", g.name ? *g.name + ", " : "", or_unknown(g.numa_node),
                     g.bar1_bytes ? format_size(*g.bar1_bytes) : "unknown",
                     g.cuda_driver_version ? ", cuda driver " + *g.cuda_driver_version : ""));
  const auto& n = r.nvfs;
  if (!n.loaded) {
    line("nvidia-fs", "not loaded: " + n.reason);
  } else {
    line("nvidia-fs", fmt::format("loaded, version {}, {} device(s)", or_unknown(n.version),
                                  or_unknown(n.devcount)));
    line("  storage drivers", n.storage_modules.empty()
                                  ? "none"
                                  : fmt::format("{}", fmt::join(n.storage_modules, ", ")));
    line("  nvme registered", yes_no(n.nvme_registered));
    line("  rw stats", yes_no(n.rw_stats_enabled, "enabled", "disabled (reads not counted)"));
    if (n.reads_n) line("  reads", fmt::format("n={} MiB={}", *n.reads_n, or_unknown(n.reads_mib)));
  }
  line("cufile.json", fmt::format("{}{}: {} ({})", r.cufile.path,
                                  r.cufile.path_from_env ? " (CUFILE_ENV_PATH_JSON)" : "",
                                  r.cufile.state, r.cufile.detail));
  for (const auto& v : r.cufile.values)
    line("  " + v.key, v.value ? fmt::format("{} ({})", *v.value, v.source)
                               : fmt::format("unknown: {}", v.problem));
  for (const auto& e : r.cufile.cufile_env) line("  env", e);
  line("iommu", r.iommu.how);
  line("acs", r.acs.how);
  line("p2pdma", r.p2pdma.how);
  if (storage) {
    const auto& s = *storage;
    line("file", s.file);
    line("  mount",
         s.mount_point
             ? fmt::format("{} {} from {} ({}) options {} super {}", *s.mount_point,
                           or_unknown(s.fs_type), or_unknown(s.source), or_unknown(s.device),
                           or_unknown(s.mount_options), or_unknown(s.super_options))
             : "unknown: " + s.mount_reason);
    line("  statfs type", or_unknown(s.statfs_type));
    line("  udev ID_FS_USAGE", yes_no(s.udev_fs_usage) + ": " + s.udev_reason);
    line("  pci", s.pci_function
                      ? fmt::format("{} numa {}", *s.pci_function, or_unknown(s.pci_numa_node))
                      : "unknown: " + s.pci_reason);
    for (const auto& d : s.gpu_distances)
      line("  to gpu " + d.gpu_bus_id, fmt::format("{} ({})", or_unknown(d.distance), d.reason));
  }
  return o;
}

}  // namespace ferry
