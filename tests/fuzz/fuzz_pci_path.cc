// Fuzzes the parsing of resolved sysfs device paths into PCI chains and the distance between two
// of them. Input: two paths separated by a newline. A known location holds PCI addresses only,
// and a known location is at distance PIX from itself.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "platform/pci_topology.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ferry::platform;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  auto nl = input.find('\n');
  std::string_view first = input.substr(0, nl);
  std::string_view second = nl == std::string_view::npos ? first : input.substr(nl + 1);
  PciLocation a = parse_sysfs_device_path(first);
  PciLocation b = parse_sysfs_device_path(second);
  for (const PciLocation* loc : {&a, &b}) {
    FUZZ_CHECK(!loc->reason.empty());
    if (!loc->known) continue;
    FUZZ_CHECK(!loc->chain.empty() && !loc->host_bridge.empty());
    for (const std::string& f : loc->chain) FUZZ_CHECK(is_pci_address(f));
    PciDistanceResult self = pci_distance(*loc, *loc);
    FUZZ_CHECK(self.distance == PciDistance::kPix);
  }
  b.numa_node = static_cast<int>(size % 3) - 1;
  PciDistanceResult d = pci_distance(a, b);
  FUZZ_CHECK(!d.reason.empty());
  if (!a.known || !b.known) FUZZ_CHECK(!d.distance.has_value());
  (void)is_pci_address(input);
  return 0;
}
