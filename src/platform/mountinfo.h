// /proc/self/mountinfo: every mount with its device, options and file-system type, and the lookup
// of the mount that holds a file (by the file's st_dev, else by the longest mount-point prefix).
// Pure parser plus a reader that takes a root directory. Thread-safe.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::platform {

struct DeviceNumber {
  unsigned major = 0;
  unsigned minor = 0;
  bool operator==(const DeviceNumber&) const = default;
};
std::string to_string(DeviceNumber d);  // "254:0"

struct MountEntry {
  int mount_id = 0;
  DeviceNumber device;
  std::string root;         // the subtree of the file system mounted here
  std::string mount_point;  // unescaped ("\040" -> ' ')
  std::string mount_options;
  std::vector<std::string> optional_fields;  // "shared:1", "master:2"
  std::string fs_type;
  std::string source;         // "/dev/nvme0n1p1"
  std::string super_options;  // per-superblock options, e.g. ext4 "rw,data=ordered"
};

// Lines that do not parse are skipped and described in `errors` (when given).
std::vector<MountEntry> parse_mountinfo(std::string_view text,
                                        std::vector<std::string>* errors = nullptr);

// Decodes the octal escapes the kernel uses for space, tab, newline and backslash.
std::string unescape_mount_field(std::string_view field);

struct MountLookup {
  std::optional<MountEntry> mount;
  std::string how;  // "by device 259:1 and mount point /data" or why none was found
  bool by_device = false;
};

// `path` must be absolute and normalised. With `device`, only mounts of that device count (bind
// mounts repeat a device; the longest mount-point prefix among them wins); without it, or when no
// mount of the device is a prefix, the longest prefix over all mounts. A later mount on the same
// mount point hides an earlier one.
MountLookup find_mount(const std::vector<MountEntry>& mounts, const std::filesystem::path& path,
                       std::optional<DeviceNumber> device);

// stat()s `file` (a real path) for its device and looks it up in root/proc/self/mountinfo.
MountLookup find_mount_for_file(const std::filesystem::path& root,
                                const std::filesystem::path& file);

}  // namespace ferry::platform
