// TEST ONLY hooks of the cuFile backend. Nothing in the library or the tools calls the setters;
// tests/cufile does, so that the cuFile test double (which reads into host memory) can stand in
// for cuFile on machines without a GPU, and so that captured /proc trees replace the machine's.
// Thread-safe (atomics and a mutex); set them before the requests they should affect.
#pragma once

#include <array>
#include <filesystem>
#include <optional>
#include <string_view>

#include "ferry/memory.h"

namespace ferry::cufile::testing {

// Layer 1 then treats a host buffer as memory of GPU 0. The bytes still move as host memory:
// the POSIX path reads them with pread and the cuFile path hands the host address to the double.
void treat_host_as_gpu(bool on);
bool host_treated_as_gpu();
// Which GPU host memory stands in for, for requests submitted by the calling thread (0 unless
// set), so that one test can give two requests two GPUs.
void set_thread_gpu(int device);
// The UUID layer 2 uses for `device` in place of cuDeviceGetUuid's (16 bytes), or none to ask
// the driver again.
void set_gpu_uuid(int device, std::optional<std::string_view> uuid);
std::optional<std::array<char, 16>> gpu_uuid(int device);
// The memory as layer 1 sees it: `memory` itself unless treat_host_as_gpu is on.
MemoryInfo route_view(const MemoryInfo& memory);

// Where /proc/driver/nvidia-fs and /sys/module/nvidia_fs are read from ("/" by default).
void set_root(const std::filesystem::path& root);
std::filesystem::path root();

}  // namespace ferry::cufile::testing
