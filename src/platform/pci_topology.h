// Where a PCI function or a block device sits in the PCIe tree (from sysfs symlinks under a root
// directory) and the distance between two of them in nvidia-smi's terms (PIX, PXB, PHB, NODE,
// SYS). The rule is documented at pci_distance() and in docs/platform.md. Thread-safe.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "platform/mountinfo.h"

namespace ferry::platform {

struct PciLocation {
  bool known = false;
  std::string reason;              // why unknown, or how it was found
  std::string sysfs_path;          // relative to the root: "sys/devices/pci0000:3a/..."
  std::string host_bridge;         // "pci0000:3a": the root bus / host bridge
  std::vector<std::string> chain;  // PCI functions from the root port down to the device
  std::optional<int> numa_node;    // -1 when the platform reports no affinity
  const std::string& function() const { return chain.back(); }  // requires known
};

bool is_pci_address(std::string_view s);  // "0000:3b:00.0" (domain may be longer)

// Parses a resolved sysfs path (relative or absolute) such as
// "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/nvme/nvme0/nvme0n1/nvme0n1p1".
PciLocation parse_sysfs_device_path(std::string_view path);

// root/sys/bus/pci/devices/<address> -> its place in the tree, with numa_node.
PciLocation locate_pci_function(const std::filesystem::path& root, std::string_view address);

// root/sys/dev/block/<major>:<minor> -> the PCI function that serves the block device (an NVMe
// controller, a virtio disk, ...). Partitions resolve through their disk; virtual devices (loop,
// dm, md, zram, NVMe multipath heads) are reported as not PCI, with the reason.
PciLocation locate_block_device(const std::filesystem::path& root, DeviceNumber device);

enum class PciDistance { kPix, kPxb, kPhb, kNode, kSys };
std::string_view to_string(PciDistance d);

struct PciDistanceResult {
  std::optional<PciDistance> distance;
  std::string reason;
};

// nvidia-smi topo's vocabulary, decided from the two chains:
//  - different host bridges: NODE when both numa_node values are equal (and >= 0), SYS when they
//    differ; both -1 (no NUMA information) is taken as one node, NODE, and said so;
//  - same host bridge, no shared bridge: PHB (the path turns at the root complex);
//  - shared bridges: let L be the last one; PIX when each device is at most one bridge below L
//    (both in one switch: L is its upstream port; or both directly under L), else PXB.
PciDistanceResult pci_distance(const PciLocation& a, const PciLocation& b);

}  // namespace ferry::platform
