// NVIDIA GPUs as sysfs shows them (vendor 0x10de, class 0x03xxxx under /sys/bus/pci/devices): bus
// id, NUMA node, BAR1 size, and the kernel driver version from /proc/driver/nvidia/version.
// Names and CUDA versions come from libcuda, elsewhere. Pure parsers plus readers; thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::platform {

// One line of a sysfs `resource` file: start end flags.
struct PciResource {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint64_t flags = 0;
  std::uint64_t size() const { return end >= start && (start || end) ? end - start + 1 : 0; }
  bool is_memory() const { return (flags & 0x200) != 0; }  // IORESOURCE_MEM
};
std::vector<PciResource> parse_pci_resource(std::string_view text);

// NVIDIA's BAR1 (the framebuffer aperture) is the second memory BAR, whatever its register
// index: see gpu_sysfs.cc.
std::optional<std::uint64_t> nvidia_bar1_size(const std::vector<PciResource>& resources);

struct GpuSysfs {
  std::string bus_id;  // "0000:3b:00.0"
  std::uint32_t device_id = 0;
  std::optional<int> numa_node;
  std::optional<std::uint64_t> bar1_bytes;
};

struct GpuList {
  bool known = false;
  std::vector<GpuSysfs> gpus;
  std::string reason;
};
GpuList read_gpus(const std::filesystem::path& root);

// "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..." ->
// "580.159.04".
std::optional<std::string> parse_nvidia_driver_version(std::string_view text);

struct DriverVersion {
  std::optional<std::string> version;
  std::string reason;
};
DriverVersion read_nvidia_driver_version(const std::filesystem::path& root);

}  // namespace ferry::platform
