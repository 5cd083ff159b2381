// What the cuFile path reads of the machine it runs on, beyond libcufile itself: the tree that
// holds /proc/driver/nvidia-fs, /sys/module/nvidia_fs and /etc/cufile.json ("/": this machine's;
// a captured tree under tests/data/platform stands for another machine), and where GPU UUIDs come
// from (layer 2 matches cuFile's per-GPU counters by UUID). Part of an environment
// (core/paths.h): src/backends/paths.cc makes the default one.
#pragma once

#include <array>
#include <filesystem>
#include <functional>
#include <optional>

namespace ferry::cufile {

struct Machine {
  std::filesystem::path root = "/";
  // GPU `device`'s UUID where this machine names it; empty, or nullopt for a device: the
  // driver's (cuDeviceGetUuid).
  std::function<std::optional<std::array<char, 16>>(int device)> gpu_uuid;
};

}  // namespace ferry::cufile
