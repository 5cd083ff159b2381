#include "platform/pci_topology.h"

#include <fmt/format.h>

#include <cctype>

#include "platform/text_file.h"

namespace ferry::platform {
namespace {

bool all_hex(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// "pci0000:3a": a root bus, i.e. a host bridge.
bool is_host_bridge(std::string_view s) {
  if (s.substr(0, 3) != "pci") return false;
  auto rest = s.substr(3);
  auto colon = rest.find(':');
  return colon != std::string_view::npos && all_hex(rest.substr(0, colon)) &&
         all_hex(rest.substr(colon + 1));
}

// Resolves a sysfs symlink under `root` and returns the target relative to the resolved root.
std::optional<std::string> resolve_under(const std::filesystem::path& root,
                                         const std::filesystem::path& link, std::string& error) {
  std::error_code ec;
  auto base = std::filesystem::canonical(root, ec);
  if (ec) {
    error = fmt::format("{}: {}", root.string(), ec.message());
    return std::nullopt;
  }
  auto target = std::filesystem::canonical(link, ec);
  if (ec) {
    error = fmt::format("{}: {}", link.string(), ec.message());
    return std::nullopt;
  }
  auto rel = target.lexically_relative(base);
  if (rel.empty() || *rel.begin() == "..") {
    error = fmt::format("{} resolves outside {}", link.string(), root.string());
    return std::nullopt;
  }
  return rel.string();
}

void read_numa(const std::filesystem::path& root, PciLocation& loc) {
  if (!loc.known) return;
  // The function's own directory: the resolved path up to and including its address.
  std::filesystem::path dir = root;
  for (const auto& comp : std::filesystem::path(loc.sysfs_path)) {
    dir /= comp;
    if (comp == loc.function()) break;
  }
  auto f = read_text_file(dir / "numa_node");
  if (f.ok)
    if (auto v = parse_i64(f.text)) loc.numa_node = static_cast<int>(*v);
}

}  // namespace

bool is_pci_address(std::string_view s) {
  // DDDD:BB:DD.F
  auto c1 = s.find(':');
  if (c1 == std::string_view::npos || c1 < 4) return false;
  auto rest = s.substr(c1 + 1);
  return rest.size() == 7 && all_hex(s.substr(0, c1)) && all_hex(rest.substr(0, 2)) &&
         rest[2] == ':' && all_hex(rest.substr(3, 2)) && rest[5] == '.' && rest[6] >= '0' &&
         rest[6] <= '7';
}

std::string_view to_string(PciDistance d) {
  switch (d) {
    case PciDistance::kPix:
      return "PIX";
    case PciDistance::kPxb:
      return "PXB";
    case PciDistance::kPhb:
      return "PHB";
    case PciDistance::kNode:
      return "NODE";
    case PciDistance::kSys:
      return "SYS";
  }
  return "?";
}

PciLocation parse_sysfs_device_path(std::string_view path) {
  PciLocation loc;
  loc.sysfs_path = std::string(path);
  bool in_tree = false;
  for (const auto& comp : std::filesystem::path(std::string(path))) {
    std::string c = comp.string();
    if (!in_tree) {
      if (is_host_bridge(c)) {
        loc.host_bridge = c;
        in_tree = true;
      }
      continue;
    }
    if (!is_pci_address(c)) break;
    loc.chain.push_back(c);
  }
  if (loc.host_bridge.empty()) {
    loc.reason = fmt::format("{} is not under a PCI host bridge (a virtual device)", path);
    return loc;
  }
  if (loc.chain.empty()) {
    loc.reason = fmt::format("{} names no PCI function below {}", path, loc.host_bridge);
    return loc;
  }
  loc.known = true;
  loc.reason = fmt::format("PCI function {} under {}", loc.chain.back(), loc.host_bridge);
  return loc;
}

PciLocation locate_pci_function(const std::filesystem::path& root, std::string_view address) {
  auto link = under_root(root, "/sys/bus/pci/devices") / std::string(address);
  std::string error;
  auto rel = resolve_under(root, link, error);
  if (!rel) {
    PciLocation loc;
    loc.reason = fmt::format("cannot resolve PCI device {}: {}", address, error);
    return loc;
  }
  auto loc = parse_sysfs_device_path(*rel);
  read_numa(root, loc);
  return loc;
}

PciLocation locate_block_device(const std::filesystem::path& root, DeviceNumber device) {
  auto link = under_root(root, "/sys/dev/block") / to_string(device);
  std::string error;
  auto rel = resolve_under(root, link, error);
  if (!rel) {
    PciLocation loc;
    loc.reason = fmt::format("cannot resolve block device {}: {}", to_string(device), error);
    return loc;
  }
  auto loc = parse_sysfs_device_path(*rel);
  if (!loc.known && rel->find("/virtual/") != std::string::npos) {
    std::string_view kind = rel->find("nvme-subsys") != std::string::npos
                                ? "an NVMe multipath namespace; its controllers are the PCI paths"
                                : "a virtual block device (loop, dm, md, zram, ...)";
    loc.reason = fmt::format("block device {} is {}: {}", to_string(device), kind, *rel);
  }
  read_numa(root, loc);
  return loc;
}

PciDistanceResult pci_distance(const PciLocation& a, const PciLocation& b) {
  if (!a.known || !b.known)
    return {std::nullopt, fmt::format("unknown: {}", !a.known ? a.reason : b.reason)};
  if (a.host_bridge != b.host_bridge) {
    int na = a.numa_node.value_or(-1), nb = b.numa_node.value_or(-1);
    if (na >= 0 && nb >= 0) {
      if (na == nb)
        return {PciDistance::kNode, fmt::format("different host bridges ({}, {}) on NUMA node {}",
                                                a.host_bridge, b.host_bridge, na)};
      return {PciDistance::kSys,
              fmt::format("different host bridges ({}, {}) on NUMA nodes {} and {}", a.host_bridge,
                          b.host_bridge, na, nb)};
    }
    if (na < 0 && nb < 0)
      return {PciDistance::kNode,
              fmt::format("different host bridges ({}, {}); no NUMA information (numa_node -1), "
                          "taken as one node",
                          a.host_bridge, b.host_bridge)};
    return {std::nullopt,
            fmt::format("NODE or SYS: different host bridges and only one numa_node is known")};
  }
  std::size_t k = 0;
  while (k + 1 < a.chain.size() && k + 1 < b.chain.size() && a.chain[k] == b.chain[k]) ++k;
  if (a.function() == b.function()) return {PciDistance::kPix, "the same PCI function"};
  if (k == 0)
    return {PciDistance::kPhb,
            fmt::format("same host bridge {}, no shared PCIe bridge", a.host_bridge)};
  std::size_t below_a = a.chain.size() - k, below_b = b.chain.size() - k;
  const std::string& shared = a.chain[k - 1];
  if (below_a <= 2 && below_b <= 2)
    return {PciDistance::kPix, fmt::format("both behind bridge {} (one switch)", shared)};
  return {PciDistance::kPxb,
          fmt::format("both behind bridge {}, through {} and {} levels of bridges", shared,
                      below_a - 1, below_b - 1)};
}

}  // namespace ferry::platform
