#include "platform/fs_type.h"

#include <fmt/format.h>
#include <sys/vfs.h>

#include <cerrno>
#include <cstring>

namespace ferry::platform {

// Magic numbers from linux/magic.h and, for xfs, lustre, gpfs and beegfs (file systems GDS
// supports), from their own headers.
std::string fs_magic_name(std::uint64_t magic) {
  switch (magic) {
    case 0xEF53:
      return "ext2/ext3/ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x794C7630:
      return "overlay";
    case 0x6969:
      return "nfs";
    case 0xFF534D42:
      return "cifs";
    case 0x65735546:
      return "fuse";
    case 0x0BD00BD0:
      return "lustre";
    case 0x47504653:
      return "gpfs";
    case 0x19830326:
      return "beegfs";
    case 0x2FC12FC1:
      return "zfs";
    case 0x9FA0:
      return "proc";
    case 0x62656572:
      return "sysfs";
    case 0x858458F6:
      return "ramfs";
    case 0x73717368:
      return "squashfs";
    case 0x4D44:
      return "vfat";
    case 0xF2F52010:
      return "f2fs";
    case 0x01161970:
      return "gfs2";
    case 0x5346544E:
      return "ntfs";
    case 0x6E736673:
      return "nsfs";
    case 0x61756673:
      return "aufs";
  }
  return fmt::format("unknown ({:#x})", magic);
}

FsType statfs_type(const std::filesystem::path& path) {
  FsType out;
  struct statfs sf {};
  if (::statfs(path.c_str(), &sf) != 0) {
    out.error = fmt::format("statfs {}: {}", path.string(), std::strerror(errno));
    return out;
  }
  out.ok = true;
  out.magic = static_cast<std::uint64_t>(static_cast<std::uint32_t>(sf.f_type));
  out.name = fs_magic_name(out.magic);
  return out;
}

}  // namespace ferry::platform
