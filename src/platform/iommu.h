// Whether an IOMMU translates DMA (it routes GPU-storage peer traffic through the root complex;
// the GDS guide recommends it off), how that was determined, and PCIe ACS as nvidia-fs reports it.
// Reads /sys/class/iommu, /sys/kernel/iommu_groups, /proc/cmdline and nvidia-fs's bridges under a
// root directory. Thread-safe.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "platform/nvfs_proc.h"

namespace ferry::platform {

struct KernelIommuArgs {
  std::optional<std::string> intel_iommu;        // "on", "off", "sm_on", ...
  std::optional<std::string> amd_iommu;          // "off", "on", "pgtbl_v2", ...
  std::optional<std::string> iommu;              // "pt", "off", "nopt", "force"
  std::optional<std::string> iommu_passthrough;  // iommu.passthrough=
};
KernelIommuArgs parse_kernel_iommu_args(std::string_view cmdline);

struct IommuState {
  std::optional<bool> enabled;
  bool passthrough = false;        // iommu=pt / iommu.passthrough=1: host DMA not translated
  std::string how;                 // the evidence, in words
  std::vector<std::string> units;  // /sys/class/iommu entries (dmar0, ivhd0, ...)
  std::size_t groups = 0;          // /sys/kernel/iommu_groups entries
  std::optional<std::string> cmdline;
};
IommuState read_iommu(const std::filesystem::path& root);

struct AcsState {
  std::optional<bool> any_enabled;
  std::vector<std::string> bridges;  // ACS-enabled bridges, from nvidia-fs
  std::string how;
};
AcsState acs_from_nvfs(const NvfsSnapshot& nvfs);

}  // namespace ferry::platform
