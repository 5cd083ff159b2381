#include "io/numa_staging.h"

#include <fmt/format.h>
#include <linux/mempolicy.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <climits>
#include <mutex>
#include <optional>
#include <vector>

#include "cuda/cuda_driver.h"
#include "platform/pci_topology.h"
#include "platform/text_file.h"

namespace ferry::io {

int count_node_list(std::string_view list) {
  list = platform::trim(list);
  if (list.empty()) return 0;
  int count = 0;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
    const std::size_t dash = item.find('-');
    auto lo = platform::parse_i64(item.substr(0, dash));
    auto hi = dash == std::string_view::npos ? lo : platform::parse_i64(item.substr(dash + 1));
    if (!lo || !hi || *lo < 0 || *hi < *lo || *hi > 4095) return 0;
    count += static_cast<int>(*hi - *lo + 1);
  }
  return count;
}

StagingNode staging_node_for(const std::filesystem::path& root, std::string_view bus_id) {
  StagingNode out;
  auto online = platform::read_text_file(root / "sys/devices/system/node/online");
  const int nodes = online.ok ? count_node_list(online.text) : 0;
  if (nodes <= 1) {
    out.why =
        nodes == 1 ? "one NUMA node" : "NUMA nodes unknown (no sys/devices/system/node/online)";
    return out;
  }
  const std::string address = platform::lower(bus_id);
  platform::PciLocation loc = platform::locate_pci_function(root, address);
  if (!loc.known) {
    out.why = fmt::format("{} NUMA nodes; the GPU's place is unknown ({})", nodes, loc.reason);
    return out;
  }
  if (!loc.numa_node || *loc.numa_node < 0) {
    out.why = fmt::format("{} NUMA nodes; the GPU ({}) reports no affinity", nodes, address);
    return out;
  }
  out.node = *loc.numa_node;
  out.why = fmt::format("on NUMA node {}, the GPU's ({}; {} nodes)", out.node, address, nodes);
  return out;
}

StagingNode staging_node(int device) {
  constexpr int kCached = 64;
  // Process-wide: a GPU's NUMA node is the machine's, the same for every runtime.
  static struct {
    std::mutex mu;
    std::array<std::optional<StagingNode>, kCached> by_device;  // under mu
  } cache;
  if (device >= 0 && device < kCached) {
    std::lock_guard lock(cache.mu);
    if (cache.by_device[device]) return *cache.by_device[device];
  }
  StagingNode node;
  const cuda::Driver* d = cuda::driver_or_null();
  char bus_id[64] = {};
  cuda::abi::Device dev = 0;
  if (d == nullptr || d->DeviceGet(&dev, device) != cuda::abi::kSuccess ||
      d->DeviceGetPCIBusId(bus_id, sizeof bus_id, dev) != cuda::abi::kSuccess) {
    node.why = "the GPU's PCI address is unknown";
  } else {
    node = staging_node_for("/", bus_id);
  }
  if (device >= 0 && device < kCached) {
    std::lock_guard lock(cache.mu);
    cache.by_device[device] = node;
  }
  return node;
}

bool prefer_node(void* p, std::size_t bytes, int node) {
  if (node < 0 || node >= 1024) {
    errno = EINVAL;
    return false;
  }
  std::vector<unsigned long> mask(1024 / (CHAR_BIT * sizeof(unsigned long)), 0);
  mask[node / (CHAR_BIT * sizeof(unsigned long))] |= 1UL
                                                     << (node % (CHAR_BIT * sizeof(unsigned long)));
  return syscall(SYS_mbind, p, bytes, MPOL_PREFERRED, mask.data(),
                 mask.size() * CHAR_BIT * sizeof(unsigned long), 0) == 0;
}

}  // namespace ferry::io
