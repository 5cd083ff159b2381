// ferry::PlatformReport: what this machine offers GPUDirect Storage, read from /proc, /sys,
// /run/udev and cufile.json under a root directory ("/" in production, captured trees in tests).
// Every field that could not be read is empty and its `*_reason` says why; reading never throws.
// Plain values; the functions are thread-safe. GPU names and the CUDA driver version come from
// libcuda and are filled by the caller that loads it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace ferry {

struct PlatformGpu {
  std::string bus_id;  // "0000:3b:00.0"
  std::optional<int> numa_node;
  std::optional<std::uint64_t> bar1_bytes;
  std::optional<std::string> name;                 // from libcuda, filled by the caller
  std::optional<std::string> cuda_driver_version;  // from libcuda, filled by the caller
};

struct PlatformNvfs {
  bool loaded = false;
  std::string reason;  // why not loaded, or what could not be read
  std::optional<std::string> version;
  std::optional<std::uint64_t> devcount;
  std::vector<std::string> storage_modules;  // "nvme 2.28": drivers registered with nvidia-fs
  std::optional<bool> nvme_registered;       // an "nvme" line in modules
  std::optional<bool> rw_stats_enabled;
  std::optional<std::uint64_t> reads_n;  // cumulative, system-wide; only with rw stats on
  std::optional<std::uint64_t> reads_mib;
};

// One effective cufile.json value and where it came from ("default", "file", "environment").
struct PlatformCufileValue {
  std::string key;                   // "execution.parallel_io"
  std::optional<std::string> value;  // "true", "8192"; empty when unknown
  std::string source;
  std::string problem;  // why unknown, or the type error naming the key
};

struct PlatformCufileConfig {
  std::string path;  // as cuFile names it
  bool path_from_env = false;
  std::string state;   // loaded, missing, unreadable, empty, too large, not UTF-8, malformed
  std::string detail;  // in words, with line and column for a syntax error
  std::vector<PlatformCufileValue> values;
  std::vector<std::string> problems;
  std::vector<std::string> cufile_env;  // "CUFILE_STATS_LEVEL=3"
};

struct PlatformState {
  std::optional<bool> on;
  std::string how;  // the evidence, or why it is unknown
};

struct PlatformReport {
  std::string root;
  std::optional<std::string> kernel_release;
  std::optional<std::string> nvidia_driver_version;
  std::string nvidia_driver_reason;
  std::vector<PlatformGpu> gpus;
  std::string gpus_reason;
  PlatformNvfs nvfs;
  PlatformCufileConfig cufile;
  PlatformState iommu;
  std::vector<std::string> acs_bridges;
  PlatformState acs;
  PlatformState p2pdma;
};

PlatformReport read_platform(const std::filesystem::path& root = "/");

// "0000:3B:00.0" (libcuda) and "0000:3b:00.0" (sysfs) name one PCI function: lower case, with a
// four-digit domain (libcuda may print eight).
std::string normalize_pci_bus_id(std::string id);

// The effective value of a cufile.json key ("properties.allow_compat_mode") as text, or nullopt
// when it is unknown.
std::optional<std::string> cufile_setting(const PlatformReport& report, std::string_view key);

// The storage under one file: its mount, device, udev entry (which cuFile needs) and PCI distance
// to each GPU of `gpus`.
struct PlatformGpuDistance {
  std::string gpu_bus_id;
  std::optional<std::string> distance;  // PIX, PXB, PHB, NODE, SYS
  std::string reason;
};

struct PlatformStorage {
  std::string file;
  std::optional<std::string> mount_point;
  std::optional<std::string> fs_type;  // from mountinfo: "ext4"
  std::optional<std::string> mount_options;
  std::optional<std::string> super_options;  // "rw,data=ordered"
  std::optional<std::string> source;         // "/dev/nvme0n1p1"
  std::optional<std::string> device;         // "259:1"
  std::string mount_reason;
  std::optional<std::string> statfs_type;  // "ext2/ext3/ext4": statfs cannot tell them apart
  std::optional<bool> udev_fs_usage;       // ID_FS_USAGE in /run/udev/data/b<maj>:<min>
  std::string udev_reason;
  std::optional<std::string> pci_function;  // the controller or disk's PCI address
  std::optional<int> pci_numa_node;
  std::string pci_reason;
  std::vector<PlatformGpuDistance> gpu_distances;
};

// `file` is a real path (stat()ed directly); the tables it is looked up in are under `root`.
PlatformStorage read_storage(const std::filesystem::path& file,
                             const std::vector<PlatformGpu>& gpus,
                             const std::filesystem::path& root = "/");

// JSON text (an object; storage included when given), and a human report.
std::string platform_report_json(const PlatformReport& report,
                                 const std::optional<PlatformStorage>& storage = std::nullopt);
std::string format_platform_report(const PlatformReport& report,
                                   const std::optional<PlatformStorage>& storage = std::nullopt);

}  // namespace ferry
