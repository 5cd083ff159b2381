// ferry::read_platform and ferry::read_storage: the platform readers gathered into the public
// report. Nothing here decides routes; it only records what the machine shows.
#include <fmt/format.h>

#include "ferry/platform.h"
#include "platform/cufile_config.h"
#include "platform/fs_type.h"
#include "platform/gpu_sysfs.h"
#include "platform/iommu.h"
#include "platform/mountinfo.h"
#include "platform/nvfs_proc.h"
#include "platform/p2pdma.h"
#include "platform/pci_topology.h"
#include "platform/text_file.h"
#include "platform/udev_db.h"

namespace ferry {
namespace {

using namespace platform;

template <typename T>
PlatformCufileValue cufile_value(const CufileValue<T>& v) {
  PlatformCufileValue out;
  out.key = v.key;
  if (v.value) {
    if constexpr (std::is_same_v<T, bool>)
      out.value = *v.value ? "true" : "false";
    else
      out.value = std::to_string(*v.value);
  }
  out.source = std::string(to_string(v.source));
  out.problem = v.problem;
  return out;
}

PlatformCufileConfig cufile_section(const CufileConfig& c) {
  PlatformCufileConfig out;
  out.path = c.path.string();
  out.path_from_env = c.path_from_env;
  out.state = std::string(to_string(c.state));
  out.detail = c.state_detail;
  out.problems = c.problems;
  out.values = {cufile_value(c.allow_compat_mode),
                cufile_value(c.force_compat_mode),
                cufile_value(c.use_pci_p2pdma),
                cufile_value(c.max_direct_io_size_kb),
                cufile_value(c.parallel_io),
                cufile_value(c.max_io_threads),
                cufile_value(c.min_io_threshold_size_kb),
                cufile_value(c.max_request_parallelism),
                cufile_value(c.max_io_queue_depth)};
  for (const auto& [k, v] : c.cufile_env) out.cufile_env.push_back(k + "=" + v);
  return out;
}

PlatformNvfs nvfs_section(const NvfsSnapshot& s) {
  PlatformNvfs n;
  n.loaded = s.loaded;
  n.reason = s.reason;
  n.version = s.version;
  n.devcount = s.devcount;
  if (s.modules) {
    for (const auto& [name, version] : *s.modules)
      n.storage_modules.push_back(version.empty() ? name : name + " " + version);
    n.nvme_registered = s.modules->count("nvme") > 0;
  }
  n.rw_stats_enabled = s.rw_stats_enabled;
  if (s.stats && s.stats->reads) {
    n.reads_n = s.stats->reads->n;
    n.reads_mib = s.stats->reads->mib;
  }
  if (n.loaded && n.reason.empty()) n.reason = "/proc/driver/nvidia-fs exists";
  return n;
}

}  // namespace

std::string normalize_pci_bus_id(std::string id) {
  id = lower(id);
  auto colon = id.find(':');
  if (colon != std::string::npos && colon > 4 && id.find(':', colon + 1) != std::string::npos) {
    id.erase(0, colon - 4);
  }
  return id;
}

std::optional<std::string> cufile_setting(const PlatformReport& report, std::string_view key) {
  for (const PlatformCufileValue& v : report.cufile.values) {
    if (v.key == key) return v.value;
  }
  return std::nullopt;
}

PlatformReport read_platform(const std::filesystem::path& root) {
  PlatformReport r;
  r.root = root.string();
  if (auto rel = read_text_file(under_root(root, "/proc/sys/kernel/osrelease")); rel.ok)
    r.kernel_release = std::string(trim(rel.text));
  auto driver = read_nvidia_driver_version(root);
  r.nvidia_driver_version = driver.version;
  r.nvidia_driver_reason = driver.reason;
  auto gpus = read_gpus(root);
  r.gpus_reason = gpus.reason;
  for (const auto& g : gpus.gpus)
    r.gpus.push_back(PlatformGpu{g.bus_id, g.numa_node, g.bar1_bytes, std::nullopt, std::nullopt});
  auto nvfs = read_nvfs(root);
  r.nvfs = nvfs_section(nvfs);
  r.cufile = cufile_section(read_cufile_config(root, process_environment()));
  auto iommu = read_iommu(root);
  r.iommu = PlatformState{iommu.enabled, iommu.how};
  auto acs = acs_from_nvfs(nvfs);
  r.acs = PlatformState{acs.any_enabled, acs.how};
  r.acs_bridges = acs.bridges;
  auto p2p = read_p2pdma(root);
  r.p2pdma = PlatformState{p2p.available, p2p.how};
  return r;
}

PlatformStorage read_storage(const std::filesystem::path& file,
                             const std::vector<PlatformGpu>& gpus,
                             const std::filesystem::path& root) {
  PlatformStorage s;
  s.file = file.string();
  auto fs = statfs_type(file);
  if (fs.ok) s.statfs_type = fs.name;
  auto lookup = find_mount_for_file(root, file);
  s.mount_reason = lookup.how;
  if (!lookup.mount) {
    s.udev_reason = s.pci_reason = "unknown: the mount holding the file is unknown";
    return s;
  }
  const auto& m = *lookup.mount;
  s.mount_point = m.mount_point;
  s.fs_type = m.fs_type;
  s.mount_options = m.mount_options;
  s.super_options = m.super_options;
  s.source = m.source;
  s.device = to_string(m.device);
  if (m.device.major == 0) {
    // Major 0 is the kernel's anonymous devices: tmpfs, overlay, NFS, FUSE; no block device.
    s.udev_reason = s.pci_reason = fmt::format("{} ({}) has no block device (device {})",
                                               m.mount_point, m.fs_type, to_string(m.device));
    return s;
  }
  auto udev = read_udev_entry(root, m.device);
  if (udev.state == UdevState::kFound) s.udev_fs_usage = udev.has_fs_usage;
  if (udev.state == UdevState::kNoUdevDir || udev.state == UdevState::kNoEntry)
    s.udev_fs_usage = false;
  s.udev_reason = udev.reason;
  auto loc = locate_block_device(root, m.device);
  s.pci_reason = loc.reason;
  if (loc.known) {
    s.pci_function = loc.function();
    s.pci_numa_node = loc.numa_node;
  }
  for (const auto& g : gpus) {
    auto d = pci_distance(locate_pci_function(root, g.bus_id), loc);
    PlatformGpuDistance out{g.bus_id, std::nullopt, d.reason};
    if (d.distance) out.distance = std::string(to_string(*d.distance));
    s.gpu_distances.push_back(std::move(out));
  }
  return s;
}

}  // namespace ferry
