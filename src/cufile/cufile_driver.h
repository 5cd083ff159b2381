// cuFile's driver lifecycle: opened lazily, once, by the first request that needs it; closed at
// exit unless cuFile I/O is still in flight. Strict mode (require=gds) opens it with cuFile's
// compatibility mode refused. Every failure is kept with its reason. Thread-safe.
#pragma once

#include <atomic>
#include <filesystem>
#include <string>

#include "cufile/cufile_library.h"

namespace ferry::cufile {

struct DriverResult {
  const Library* library = nullptr;  // null when the driver is not open
  std::string why_not;
  // The driver was opened with CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE false, so cuFile
  // cannot serve a request through its compatibility path.
  bool compat_refused = false;
};

// Opens the driver on first call. `refuse_compat` (require=gds) sets ALLOW_COMPAT_MODE false
// before the open; a failed strict open is kept and not retried, and a later lenient caller may
// still open the driver with compatibility allowed. Once open, the driver serves every caller
// in the mode it was opened in.
// `root`: the tree its failure's words read nvidia-fs's presence from (cufile/cufile_machine.h).
DriverResult open_driver(bool refuse_compat, const std::filesystem::path& root = "/");

// cuFileGetVersion() (1150 for cuFile 1.15), or 0 when unknown; `why_not` then says why.
int version(std::string* why_not = nullptr);

// What the driver did so far, for ferry::cufile_status().
struct DriverState {
  bool attempted = false;
  bool open = false;
  bool compat_refused = false;
  int error = 0;  // cuFile code of the last failed open
  std::string error_text;
};
DriverState driver_state();

// cuFile calls in flight in this process; exit does not close the driver under them.
std::atomic<long>& calls_in_flight();
// True once the driver was closed at exit: handles must not be deregistered after that.
bool driver_closed();

// Why cuFile fails to open or falls back: "the nvidia-fs kernel module is not loaded
// (/proc/driver/nvidia-fs is absent)", or empty when the module is there; under `root`.
std::string nvfs_module_missing(const std::filesystem::path& root = "/");

}  // namespace ferry::cufile
