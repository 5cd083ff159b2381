// Where a GPU's pinned staging is placed: on the NUMA node of the GPU's PCI function, on machines
// with more than one node, so that its copies do not cross the socket interconnect. The node is
// read from sysfs (a root directory, for tests) once per GPU; the placement is a preference
// (mbind MPOL_PREFERRED): memory elsewhere still works when the node is full. Thread-safe.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace ferry::io {

struct StagingNode {
  int node = -1;    // -1: no preference
  std::string why;  // how it was decided, for the route report
};

// The nodes listed in a sysfs node list ("0", "0-1", "0-3,6"), or 0 when it cannot be parsed.
int count_node_list(std::string_view list);

// The GPU at PCI address `bus_id` ("0000:3B:00.0", as cuDeviceGetPCIBusId writes it) under
// `root`: its numa_node when root/sys/devices/system/node/online lists more than one node.
StagingNode staging_node_for(const std::filesystem::path& root, std::string_view bus_id);

// The same for CUDA device `device` on this machine (root "/"), cached. Needs the driver.
StagingNode staging_node(int device);

// Asks the kernel to place the pages of [p, p + bytes) on `node` when they are first touched.
// Returns false (errno set) where the kernel refuses; the memory stays usable.
bool prefer_node(void* p, std::size_t bytes, int node);

}  // namespace ferry::io
