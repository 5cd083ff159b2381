#include "cufile/cufile_outlook.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sys/vfs.h>

#include <array>
#include <mutex>

#include "cufile/cufile_driver.h"
#include "platform/cufile_config.h"
#include "platform/fs_type.h"
#include "platform/p2pdma.h"

namespace ferry::cufile {
namespace {

// Routing's words for a file system nvidia-fs does not serve, by statfs's name for it.
std::string not_served_words(const std::string& name, unsigned long magic) {
  if (name == "tmpfs") return "the file is on tmpfs, which has no block device for nvidia-fs";
  if (name == "fuse") return "the file is on a FUSE file system, which nvidia-fs does not serve";
  if (name == "overlay" || name == "btrfs" || name == "zfs")
    return fmt::format("the file is on {}, which nvidia-fs does not serve",
                       name == "overlay" ? "overlayfs" : name);
  return fmt::format("the file is on a file system (type {:#x}) that nvidia-fs does not serve",
                     magic);
}

void judge_file_system(const PlatformStorage& s, Layer2Judgement& j) {
  if (!s.fs_type) {
    j.fs_support = "unknown: " + s.mount_reason;
    j.unknowns.push_back("the file system is unknown: " + s.mount_reason);
    return;
  }
  const std::string& fs = *s.fs_type;
  switch (fs_support(fs)) {
    case FsSupport::kServed:
      if (fs == "xfs") {
        j.fs_support = "xfs: supported by nvidia-fs";
        return;
      }
      for (std::string_view mode : {"data=journal", "data=writeback"}) {
        if (s.super_options && s.super_options->find(mode) != std::string::npos) {
          j.fs_support = fmt::format("ext4 with {}: nvidia-fs needs data=ordered", mode);
          j.blocking.push_back(
              {BlockerCode::kExt4DataMode, false,
               fmt::format("{} is mounted ext4 with {}; nvidia-fs needs data=ordered",
                           s.mount_point.value_or("the mount"), mode)});
          return;
        }
      }
      j.fs_support = "ext4 in ordered data mode: supported by nvidia-fs";
      return;
    case FsSupport::kRdmaClient:
      j.fs_support = fs + ": accelerated only with its RDMA client set up for GDS";
      j.unknowns.push_back(fmt::format(
          "{} takes the nvidia-fs path only with its GDS-enabled RDMA client, which ferry does "
          "not check",
          fs));
      return;
    case FsSupport::kNotServed:
      j.fs_support = fs +
                     ": no nvidia-fs support (GDS accelerates ext4, xfs and some distributed "
                     "file systems)";
      j.blocking.push_back({BlockerCode::kFileSystem, true,
                            fmt::format("{} is {}, which nvidia-fs does not accelerate",
                                        s.mount_point.value_or("the file's mount"), fs)});
      return;
  }
}

std::string modules_text(const PlatformNvfs& nvfs) {
  std::string modules;
  for (const auto& m : nvfs.storage_modules) modules += (modules.empty() ? "" : ", ") + m;
  return modules.empty() ? "none" : modules;
}

void judge_device(const PlatformStorage& s, const PlatformNvfs& nvfs, Layer2Judgement& j) {
  if (!s.device || s.device->rfind("0:", 0) == 0) return;  // no block device: judged by fs
  const std::string source = s.source.value_or("");
  if (source.rfind("/dev/nvme", 0) == 0) {
    if (nvfs.loaded && nvfs.nvme_registered == false)
      j.blocking.push_back({BlockerCode::kNvmeUnregistered, false,
                            fmt::format("{} is NVMe but nvidia-fs has no nvme driver registered "
                                        "(modules: {})",
                                        source, modules_text(nvfs))});
  } else if (source.rfind("/dev/vd", 0) == 0) {
    j.blocking.push_back(
        {BlockerCode::kVirtioDisk, false,
         fmt::format("{} is a virtio disk, which nvidia-fs has no driver for", source)});
  } else if (nvfs.loaded) {
    j.unknowns.push_back(fmt::format(
        "{} is not NVMe; whether nvidia-fs serves it depends on its drivers (modules: {})",
        source.empty() ? *s.device : source, modules_text(nvfs)));
  }
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
    std::optional<Blocker> blocker = process_blocker(root);
    facts->text = blocker ? std::move(blocker->words) : std::string();
    facts->root = root;
  }
  return *facts->text;
}

}  // namespace

FsSupport fs_support(std::string_view name) {
  // "ext2/ext3/ext4" is statfs's name for ext4's magic, which ext2 and ext3 share.
  constexpr std::array<std::string_view, 3> kServed = {"ext4", "ext2/ext3/ext4", "xfs"};
  constexpr std::array<std::string_view, 6> kRdma = {"nfs",    "nfs4", "lustre",
                                                     "wekafs", "gpfs", "beegfs"};
  for (auto s : kServed)
    if (name == s) return FsSupport::kServed;
  for (auto s : kRdma)
    if (name == s) return FsSupport::kRdmaClient;
  return FsSupport::kNotServed;
}

std::optional<Blocker> process_blocker(const std::filesystem::path& root) {
  platform::CufileConfig config =
      platform::read_cufile_config(root, platform::process_environment());
  if (config.force_compat_mode.value.value_or(false)) {
    return Blocker{BlockerCode::kForcedCompat, true,
                   config.force_compat_mode.source == platform::ValueSource::kEnvironment
                       ? "CUFILE_FORCE_COMPAT_MODE=true forces cuFile's compatibility path"
                       : fmt::format("{} sets properties.force_compat_mode, which forces cuFile's "
                                     "compatibility path",
                                     config.path.string())};
  }
  std::string nvfs = nvfs_module_missing(root);
  if (nvfs.empty()) return std::nullopt;
  // Without nvidia-fs, cuFile 1.14+ can still DMA through the kernel's PCI P2PDMA, when its
  // configuration asks for it and the kernel supports it.
  if (config.use_pci_p2pdma.value.value_or(false)) {
    platform::P2pdmaState p2p = platform::read_p2pdma(root);
    if (p2p.available == true) return std::nullopt;
    nvfs = fmt::format("{}, and PCI P2PDMA is not available ({})", nvfs, p2p.how);
  }
  return Blocker{BlockerCode::kNvfsMissing, true, std::move(nvfs)};
}

std::optional<Blocker> file_system_blocker(int fd) {
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0) return std::nullopt;  // unknown: let cuFile decide
  const auto magic = static_cast<unsigned long>(fs.f_type);
  const std::string name = platform::fs_magic_name(magic);
  if (fs_support(name) != FsSupport::kNotServed) return std::nullopt;
  return Blocker{BlockerCode::kFileSystem, true, not_served_words(name, magic)};
}

Layer2Judgement judge_layer2(const PlatformReport& p, const PlatformStorage* storage) {
  Layer2Judgement j;
  if (cufile_setting(p, "properties.force_compat_mode") == "true")
    j.blocking.push_back(
        {BlockerCode::kForcedCompat, true,
         "properties.force_compat_mode is true (cufile.json or CUFILE_FORCE_COMPAT_MODE): cuFile "
         "serves every request through its compatibility path"});
  if (!p.nvfs.loaded) {
    // As routing judges it (process_blocker): cuFile 1.14+ DMAs through the kernel's PCI P2PDMA
    // without nvidia-fs where its configuration asks for it and the kernel has it.
    const bool p2p_asked = cufile_setting(p, "properties.use_pci_p2pdma") == "true";
    if (!p2p_asked || p.p2pdma.on != true) {
      j.blocking.push_back(
          {BlockerCode::kNvfsMissing, true,
           "nvidia-fs is not loaded: " + p.nvfs.reason +
               (p2p_asked ? ", and PCI P2PDMA is not available (" + p.p2pdma.how + ")" : "")});
    }
  }
  if (storage != nullptr) {
    judge_file_system(*storage, j);
    judge_device(*storage, p.nvfs, j);
  } else if (p.nvfs.loaded && p.nvfs.nvme_registered == false) {
    j.blocking.push_back(
        {BlockerCode::kNvmeUnregistered, false,
         fmt::format(
             "nvidia-fs has no nvme driver registered (modules: {}): it cannot serve local NVMe",
             modules_text(p.nvfs))});
  }
  if (p.iommu.on == true && p.iommu.how.find("passthrough") == std::string::npos) {
    j.blocking.push_back(
        {BlockerCode::kIommuOn, false,
         "the IOMMU is on (" + p.iommu.how +
             "); GDS documents that nvidia-fs needs it off or in passthrough mode"});
  } else if (!p.iommu.on) {
    j.unknowns.push_back("IOMMU state unknown: " + p.iommu.how);
  }
  return j;
}

Outlook accelerated_outlook(int fd, const std::filesystem::path& root) {
  const std::string& why = process_facts(root);
  if (!why.empty()) return {false, why};
  if (auto blocked = file_system_blocker(fd)) return {false, std::move(blocked->words)};
  return {true, {}};
}

}  // namespace ferry::cufile
