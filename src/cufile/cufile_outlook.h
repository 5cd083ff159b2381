// Whether cuFile could serve a file through an accelerated path (nvidia-fs, or PCI P2PDMA), from
// facts that cost no driver open and no registration: cufile.json and CUFILE_FORCE_COMPAT_MODE,
// /proc/driver/nvidia-fs, the kernel's P2PDMA support, and the file's file system. Auto mode asks
// this before anything expensive: where cuFile could only use its compatibility path, ferry's
// own POSIX path is faster, so the driver is never opened. Process facts are read once (again
// when the root of the machine's facts changes); the file system per call (one fstatfs).
// Thread-safe.
#pragma once

#include <filesystem>
#include <string>

namespace ferry::cufile {

struct Outlook {
  bool accelerated = false;
  std::string why_not;  // why cuFile could only use its compatibility path
};

// `root`: the tree of the machine's facts (cufile/cufile_machine.h).
Outlook accelerated_outlook(int fd, const std::filesystem::path& root = "/");

}  // namespace ferry::cufile
