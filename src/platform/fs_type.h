// The file-system type of a real path from statfs(2) f_type, named as users know it. statfs cannot
// tell ext2, ext3 and ext4 apart (one magic); mountinfo's type field can. Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace ferry::platform {

struct FsType {
  bool ok = false;
  std::uint64_t magic = 0;
  std::string name;   // "ext2/ext3/ext4", "xfs", "tmpfs", "overlay", "nfs", or "unknown (0x...)"
  std::string error;  // "statfs /x: No such file or directory"
};

FsType statfs_type(const std::filesystem::path& path);
std::string fs_magic_name(std::uint64_t magic);

}  // namespace ferry::platform
