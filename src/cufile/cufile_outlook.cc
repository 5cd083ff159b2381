#include "cufile/cufile_outlook.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sys/vfs.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>

#include "cufile/cufile_driver.h"
#include "platform/cufile_config.h"
#include "platform/p2pdma.h"

namespace ferry::cufile {
namespace {

// Process-wide facts: why cuFile could only use its compatibility path, or empty.
std::string read_process_facts(const std::filesystem::path& root) {
  platform::CufileConfig config =
      platform::read_cufile_config(root, platform::process_environment());
  if (config.force_compat_mode.value.value_or(false)) {
    return config.force_compat_mode.source == platform::ValueSource::kEnvironment
               ? "CUFILE_FORCE_COMPAT_MODE=true forces cuFile's compatibility path"
               : fmt::format(
                     "{} sets properties.force_compat_mode, which forces cuFile's "
                     "compatibility path",
                     config.path.string());
  }
  std::string nvfs = nvfs_module_missing(root);
  if (nvfs.empty()) return {};
  // Without nvidia-fs, cuFile 1.14+ can still DMA through the kernel's PCI P2PDMA, when its
  // configuration asks for it and the kernel supports it.
  if (config.use_pci_p2pdma.value.value_or(false)) {
    platform::P2pdmaState p2p = platform::read_p2pdma(root);
    if (p2p.available == true) return {};
    return fmt::format("{}, and PCI P2PDMA is not available ({})", nvfs, p2p.how);
  }
  return nvfs;
}

const std::string& process_facts(const std::filesystem::path& root) {
  // Process-wide: the facts are the machine's, the same for every runtime, and slow to read.
  struct Facts {
    std::mutex mu;
    std::optional<std::string> text;  // under mu: read from `root`
    std::filesystem::path root;
  };
  static Facts* facts = [] {
    auto* made = new Facts;
    // A thread of the parent may hold the lock at fork(): the child starts with a free one.
    pthread_atfork(nullptr, nullptr, [] {
      if (facts != nullptr) new (&facts->mu) std::mutex;
    });
    return made;
  }();
  std::lock_guard lock(facts->mu);
  if (!facts->text || root != facts->root) {
    facts->text = read_process_facts(root);
    facts->root = root;
  }
  return *facts->text;
}

// nvidia-fs serves local ext4 (ordered data mode) and xfs, and distributed file systems through
// their GDS-enabled RDMA clients (which cuFile, not ferry, can tell apart).
std::optional<std::string> file_system_blocks(int fd) {
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0) return std::nullopt;  // unknown: let cuFile decide
  switch (static_cast<unsigned long>(fs.f_type)) {
    case 0xEF53:      // ext4 (and ext2/3)
    case 0x58465342:  // xfs
    case 0x6969:      // nfs
    case 0x0BD00BD0:  // lustre
    case 0x47504653:  // gpfs
    case 0x19830326:  // beegfs
      return std::nullopt;
    case 0x01021994:
      return "the file is on tmpfs, which has no block device for nvidia-fs";
    case 0x794C7630:
      return "the file is on overlayfs, which nvidia-fs does not serve";
    case 0x9123683E:
      return "the file is on btrfs, which nvidia-fs does not serve";
    case 0x2FC12FC1:
      return "the file is on zfs, which nvidia-fs does not serve";
    case 0x65735546:
      return "the file is on a FUSE file system, which nvidia-fs does not serve";
    default:
      return fmt::format("the file is on a file system (type {:#x}) that nvidia-fs does not serve",
                         static_cast<unsigned long>(fs.f_type));
  }
}

}  // namespace

Outlook accelerated_outlook(int fd, const std::filesystem::path& root) {
  const std::string& why = process_facts(root);
  if (!why.empty()) return {false, why};
  if (auto blocked = file_system_blocks(fd)) return {false, *blocked};
  return {true, {}};
}

}  // namespace ferry::cufile
