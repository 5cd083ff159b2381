#include "cufile/cufile_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cufile/cufile_driver.h"

namespace ferry::cufile {
namespace {

// What the OpenFile keeps: the state, or why this file cannot go to cuFile.
struct Cached {
  std::shared_ptr<FileState> state;
  std::string why_not;
};

std::shared_ptr<Cached> open_for_cufile(const core::OpenFile& file, const Library& lib) {
  auto out = std::make_shared<Cached>();
  int flags = file.readable() && file.writable() ? O_RDWR : file.writable() ? O_WRONLY : O_RDONLY;
  // Not through the I/O seam: cuFile needs a real descriptor. Never creates or truncates: the
  // File's own open already did.
  int fd = ::open(file.path().c_str(), flags | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    out->why_not = fmt::format("O_DIRECT open of {} failed: {} (cuFile needs O_DIRECT)",
                               file.path(), std::strerror(errno));
    return out;
  }
  abi::Descr descr{};
  descr.type = abi::kHandleTypeOpaqueFd;
  descr.handle.fd = fd;
  abi::Handle handle = nullptr;
  abi::Error e = lib.HandleRegister(&handle, &descr);
  if (e.err != abi::kSuccess) {
    struct stat st {};
    const bool have_stat = ::fstat(fd, &st) == 0;
    ::close(fd);
    out->why_not = fmt::format("cuFileHandleRegister failed for {}: {}", file.path(), describe(e));
    // Measured on the GPU machine: without a udev entry for the disk (containers and VMs
    // without udev), cuFile 1.15 answers 5027 and logs "udev property not found: ID_FS_USAGE".
    // Files of tmpfs and other file systems without a block device get the same code.
    if (e.err == abi::kHandleNotRegistered && have_stat) {
      if (major(st.st_dev) == 0) {
        out->why_not += " (the file system has no block device, which cuFile needs)";
      } else {
        out->why_not += fmt::format(
            " (cuFile needs udev's ID_FS_USAGE for the file's disk, in /run/udev/data/b{}:{})",
            major(st.st_dev), minor(st.st_dev));
      }
    }
    return out;
  }
  out->state = std::make_shared<FileState>(lib, fd, handle);
  return out;
}

}  // namespace

FileState::FileState(const Library& library, int fd, abi::Handle handle)
    : library_(library), fd_(fd), handle_(handle) {}

FileState::~FileState() {
  if (!driver_closed()) library_.HandleDeregister(handle_);
  ::close(fd_);
}

Probe probe(core::OpenFile& file, const Settings& settings, const std::filesystem::path& root) {
  DriverResult driver = open_driver(settings.require == Require::kGds, root);
  if (driver.library == nullptr) return {nullptr, driver.why_not, false};
  const Library& lib = *driver.library;
  auto cached = std::static_pointer_cast<Cached>(
      file.attachment([&]() -> std::shared_ptr<void> { return open_for_cufile(file, lib); }));
  if (cached == nullptr) return {nullptr, fmt::format("{} is closed", file.path()), false};
  return {cached->state, cached->why_not, driver.compat_refused};
}

}  // namespace ferry::cufile
