// What keeps cuFile off nvidia-fs (onto its compatibility path), judged in one place for both of
// its readers. Routing's outlook asks the decisive facts before anything expensive (where cuFile
// could only use its compatibility path, ferry's own POSIX path is faster, so the driver is never
// opened): cufile.json and CUFILE_FORCE_COMPAT_MODE, /proc/driver/nvidia-fs, the kernel's P2PDMA
// support, and the file's file system; process facts are read once (again when the root of the
// machine's facts changes), the file system per call (one fstatfs). ferry explain and ferry check
// word every fact through layer2_facts. Thread-safe.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/platform.h"

namespace ferry::cufile {

enum class BlockerCode {
  kForcedCompat,      // properties.force_compat_mode (cufile.json or CUFILE_FORCE_COMPAT_MODE)
  kNvfsMissing,       // no nvidia-fs (and, for routing, no PCI P2PDMA in its place)
  kFileSystem,        // a file system nvidia-fs does not serve
  kExt4DataMode,      // ext4 mounted with data=journal or data=writeback
  kNvmeUnregistered,  // nvidia-fs loaded without its nvme driver
  kVirtioDisk,        // a virtio disk, which nvidia-fs has no driver for
  kIommuOn,           // the IOMMU on and not in passthrough mode
};

struct Blocker {
  BlockerCode code;
  // Routing keeps reads off cuFile on this fact alone (cufile_compat_only); the others only
  // predict what cuFile will do with the reads it gets.
  bool decisive;
  std::string words;
};

// What nvidia-fs makes of a file system, by the name mountinfo gives it or statfs's magic maps to
// (platform/fs_type.h): ext4 (ordered data mode) and xfs are served; distributed file systems
// only through their GDS-enabled RDMA client, which cuFile, not ferry, can tell apart.
enum class FsSupport { kServed, kRdmaClient, kNotServed };
FsSupport fs_support(std::string_view name);

// Routing's decisive facts of the process, read under `root` (cufile/cufile_machine.h):
// force_compat_mode, then nvidia-fs unless PCI P2PDMA stands in for it. Nullopt when none holds.
std::optional<Blocker> process_blocker(const std::filesystem::path& root);
// Routing's decisive fact of an open file: its file system (one fstatfs); nullopt when served,
// served through an RDMA client, or unknown (cuFile decides).
std::optional<Blocker> file_system_blocker(int fd);

// Every fact over a platform report, and given a file's `storage`, its file system and device.
struct Layer2Judgement {
  std::vector<Blocker> blocking;
  std::vector<std::string> unknowns;  // facts that could not be read or that ferry cannot judge
  std::string fs_support;             // what cuFile makes of the file system (storage only)
};
Layer2Judgement judge_layer2(const PlatformReport& platform, const PlatformStorage* storage);

struct Outlook {
  bool accelerated = false;
  std::string why_not;  // why cuFile could only use its compatibility path
};

// `root`: the tree of the machine's facts (cufile/cufile_machine.h).
Outlook accelerated_outlook(int fd, const std::filesystem::path& root = "/");

}  // namespace ferry::cufile
