// Fuzzes the small sysfs and /proc text parsers: a PCI `resource` file and NVIDIA's BAR1 choice,
// /proc/driver/nvidia/version and the IOMMU arguments of /proc/cmdline.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "platform/gpu_sysfs.h"
#include "platform/iommu.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ferry::platform;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  std::vector<PciResource> resources = parse_pci_resource(text);
  auto bar1 = nvidia_bar1_size(resources);
  FUZZ_CHECK(!bar1 || *bar1 > 0);
  auto version = parse_nvidia_driver_version(text);
  FUZZ_CHECK(!version || !version->empty());
  (void)parse_kernel_iommu_args(text);
  return 0;
}
