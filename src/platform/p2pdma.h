// PCI peer-to-peer DMA as the kernel shows it: devices that publish p2pmem
// (/sys/bus/pci/devices/*/p2pmem) and CONFIG_PCI_P2PDMA in the kernel's config where a config file
// is present. Absence of both proves nothing, so it reads as unknown. Thread-safe.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace ferry::platform {

struct P2pdmaState {
  std::optional<bool> available;
  std::vector<std::string> p2pmem_devices;  // PCI addresses with a p2pmem directory
  std::optional<bool> kernel_config;        // CONFIG_PCI_P2PDMA=y in /boot/config-<release>
  std::string how;
};

// Value of CONFIG_PCI_P2PDMA in a kernel config text: true for y, false for "is not set".
std::optional<bool> parse_kernel_config_p2pdma(std::string_view config);

P2pdmaState read_p2pdma(const std::filesystem::path& root);

}  // namespace ferry::platform
