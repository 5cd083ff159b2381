#include "platform/iommu.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "platform/text_file.h"

namespace ferry::platform {
namespace {

std::optional<std::vector<std::string>> list_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return std::nullopt;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = e.path().filename();
    if (!name.empty() && name[0] != '.') names.push_back(std::move(name));  // .gitkeep in tests
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool word_off(const std::optional<std::string>& v) { return v && (*v == "off" || *v == "0"); }

}  // namespace

KernelIommuArgs parse_kernel_iommu_args(std::string_view cmdline) {
  KernelIommuArgs a;
  for (auto tok : split_whitespace(cmdline)) {
    if (tok == "--") break;  // what follows belongs to init
    auto eq = tok.find('=');
    if (eq == std::string_view::npos) continue;
    auto key = tok.substr(0, eq);
    std::string value(tok.substr(eq + 1));
    if (key == "intel_iommu") a.intel_iommu = value;
    if (key == "amd_iommu") a.amd_iommu = value;
    if (key == "iommu") a.iommu = value;
    if (key == "iommu.passthrough") a.iommu_passthrough = value;
  }
  return a;
}

// Registered IOMMU units (/sys/class/iommu) are the direct evidence that DMA is remapped; iommu
// groups only exist when an IOMMU driver is active. The command line says what was asked for, and
// decides only when sysfs says nothing.
IommuState read_iommu(const std::filesystem::path& root) {
  IommuState s;
  auto units = list_dir(under_root(root, "/sys/class/iommu"));
  auto groups = list_dir(under_root(root, "/sys/kernel/iommu_groups"));
  auto cmd = read_text_file(under_root(root, "/proc/cmdline"));
  KernelIommuArgs args;
  if (cmd.ok) {
    s.cmdline = std::string(trim(cmd.text));
    args = parse_kernel_iommu_args(cmd.text);
  }
  if (units) s.units = *units;
  if (groups) s.groups = groups->size();
  s.passthrough = (args.iommu && *args.iommu == "pt") ||
                  (args.iommu_passthrough && *args.iommu_passthrough == "1");
  std::vector<std::string> asked;
  if (args.intel_iommu) asked.push_back("intel_iommu=" + *args.intel_iommu);
  if (args.amd_iommu) asked.push_back("amd_iommu=" + *args.amd_iommu);
  if (args.iommu) asked.push_back("iommu=" + *args.iommu);
  if (args.iommu_passthrough) asked.push_back("iommu.passthrough=" + *args.iommu_passthrough);
  std::string cmd_words = asked.empty()
                              ? "no IOMMU argument on the kernel command line"
                              : fmt::format("kernel command line: {}", fmt::join(asked, " "));
  if (!s.units.empty() || s.groups > 0) {
    s.enabled = true;
    s.how = fmt::format("on: IOMMU units [{}] in /sys/class/iommu, {} iommu group(s); {}",
                        fmt::join(s.units, ", "), s.groups, cmd_words);
    if (s.passthrough) s.how += " (passthrough: host DMA is not translated)";
    return s;
  }
  if (units || groups) {
    s.enabled = false;
    s.how = fmt::format("off: no IOMMU unit in /sys/class/iommu and no iommu group; {}", cmd_words);
    return s;
  }
  if (word_off(args.intel_iommu) || word_off(args.amd_iommu) || word_off(args.iommu)) {
    s.enabled = false;
    s.how = fmt::format("off as asked on the kernel command line ({}); sysfs shows nothing",
                        fmt::join(asked, " "));
    return s;
  }
  s.how = fmt::format("unknown: neither /sys/class/iommu nor /sys/kernel/iommu_groups exists; {}",
                      cmd.ok ? cmd_words : cmd.error);
  return s;
}

AcsState acs_from_nvfs(const NvfsSnapshot& nvfs) {
  AcsState a;
  if (!nvfs.loaded) {
    a.how = "unknown: nvidia-fs is not loaded, and ferry reads ACS only from its bridges file";
    return a;
  }
  if (!nvfs.acs_bridges) {
    a.how = "unknown: /proc/driver/nvidia-fs/bridges could not be read";
    return a;
  }
  a.bridges = *nvfs.acs_bridges;
  a.any_enabled = !a.bridges.empty();
  a.how = a.bridges.empty() ? "off: nvidia-fs lists no ACS-enabled bridge"
                            : fmt::format("on at {} bridge(s) listed by nvidia-fs: {}",
                                          a.bridges.size(), fmt::join(a.bridges, ", "));
  return a;
}

}  // namespace ferry::platform
