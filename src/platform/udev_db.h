// The udev database entry of a block device (/run/udev/data/b<major>:<minor>, "E:KEY=VALUE"
// lines). cuFile looks up ID_FS_USAGE there: without it cuFileHandleRegister fails with 5027
// (device.md; the VM without udev, and containers without /run/udev, hit this). Pure parser plus
// a reader that takes a root directory. Thread-safe.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "platform/mountinfo.h"

namespace ferry::platform {

enum class UdevState { kFound, kNoUdevDir, kNoEntry, kUnreadable };
std::string_view to_string(UdevState s);

struct UdevEntry {
  UdevState state = UdevState::kNoUdevDir;
  std::filesystem::path path;                     // the entry file, as the system names it
  std::map<std::string, std::string> properties;  // E: lines
  bool has_fs_usage = false;                      // ID_FS_USAGE present
  std::string reason;                             // what this means for cuFile, in words
};

std::map<std::string, std::string> parse_udev_properties(std::string_view text);

UdevEntry read_udev_entry(const std::filesystem::path& root, DeviceNumber device);

}  // namespace ferry::platform
