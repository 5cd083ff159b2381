#include "cufile/cufile_library.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "base/library.h"

namespace ferry::cufile {
namespace {

struct Loaded {
  Library table;
  LoadResult result;
};

void bind(base::Symbols& s, Library& t) {
  s.required(t.DriverOpen, "cuFileDriverOpen");
  // cufile.h maps cuFileDriverClose to the _v2 entry point; older libraries have only the first.
  s.required_either(t.DriverClose, "cuFileDriverClose_v2", "cuFileDriverClose");
  s.required(t.HandleRegister, "cuFileHandleRegister");
  s.required(t.HandleDeregister, "cuFileHandleDeregister");
  s.required(t.BufRegister, "cuFileBufRegister");
  s.required(t.BufDeregister, "cuFileBufDeregister");
  s.required(t.Read, "cuFileRead");
  s.required(t.Write, "cuFileWrite");
  s.optional(t.GetVersion, "cuFileGetVersion");
  s.optional(t.SetParameterBool, "cuFileSetParameterBool");
  s.optional(t.SetStatsLevel, "cuFileSetStatsLevel");
  s.optional(t.StatsStart, "cuFileStatsStart");
  s.optional(t.GetStatsL3, "cuFileGetStatsL3");
}

Loaded* load_once() {
  auto* out = new Loaded();  // Never freed: pointers into the library live as long as the process.
  base::Library<Library> lib =
      base::load_library<Library>(base::kCufileLibrary, bind);
  const std::string& name = lib.load.path;
  out->table = std::move(lib.table);
  out->table.path = name;
  out->table.missing_optional = lib.load.missing_optional;
  out->result.path = name;
  out->result.missing_required = lib.load.missing;
  if (!lib.load.opened) {
    out->result.why_not = lib.load.not_found
                              ? fmt::format("{} not found", name)
                              : fmt::format("{} could not be loaded: {}", name, lib.load.error);
  } else if (!lib.load.ok()) {
    out->result.why_not =
        fmt::format("{} lacks symbols: {}", name, fmt::join(lib.load.missing, ", "));
  } else {
    out->result.library = &out->table;
  }
  return out;
}

}  // namespace

const LoadResult& load() {
  // Process-wide: libcufile is loaded once per process (one loader, src/base/library.h).
  static const Loaded* loaded = load_once();
  return loaded->result;
}

std::string code_text(int code) {
  switch (code) {
    case abi::kSuccess:
      return "success";
    case abi::kDriverNotInitialized:
      return "driver not initialized";
    case abi::kDriverInvalidProps:
      return "invalid driver properties";
    case abi::kDriverUnsupportedLimit:
      return "driver property out of range";
    case abi::kDriverVersionMismatch:
      return "nvidia-fs driver version mismatch";
    case abi::kDriverVersionReadError:
      return "nvidia-fs driver version could not be read";
    case abi::kDriverClosing:
      return "driver is closing";
    case abi::kPlatformNotSupported:
      return "platform not supported by GDS";
    case abi::kIoNotSupported:
      return "file not supported by GDS";
    case abi::kDeviceNotSupported:
      return "GPU not supported by GDS";
    case abi::kNvfsDriverError:
      return "nvidia-fs ioctl failed";
    case abi::kCudaDriverError:
      return "CUDA driver error";
    case abi::kCudaPointerInvalid:
      return "invalid device pointer";
    case abi::kCudaMemoryTypeInvalid:
      return "invalid memory type for this pointer";
    case abi::kCudaPointerRangeError:
      return "pointer range beyond the allocation";
    case abi::kCudaContextMismatch:
      return "CUDA context mismatch";
    case abi::kInvalidMappingSize:
      return "access beyond the maximum pinned size";
    case abi::kInvalidMappingRange:
      return "access beyond the mapped size";
    case abi::kInvalidFileType:
      return "unsupported file type";
    case abi::kInvalidFileOpenFlag:
      return "unsupported file open flags";
    case abi::kDioNotSet:
      return "descriptor not opened with O_DIRECT";
    case abi::kInvalidValue:
      return "invalid arguments";
    case abi::kMemoryAlreadyRegistered:
      return "buffer already registered";
    case abi::kMemoryNotRegistered:
      return "buffer not registered";
    case abi::kPermissionDenied:
      return "driver or file access denied";
    case abi::kDriverAlreadyOpen:
      return "driver already open";
    case abi::kHandleNotRegistered:
      return "file descriptor is not registered";
    case abi::kHandleAlreadyRegistered:
      return "file descriptor is already registered";
    case abi::kDeviceNotFound:
      return "GPU not found";
    case abi::kInternalError:
      return "internal error";
    case abi::kGetNewFdFailed:
      return "could not obtain a new file descriptor";
    case abi::kNvfsSetupError:
      return "nvidia-fs initialization failed";
    case abi::kIoDisabled:
      return "GDS disabled for this file by configuration";
    case abi::kBatchSubmitFailed:
      return "batch submission failed";
    case abi::kGpuMemoryPinningFailed:
      return "GPU memory pinning failed";
    case abi::kBatchFull:
      return "batch queue full";
    case abi::kAsyncNotSupported:
      return "stream operations not supported";
    case abi::kIoError:
      return "I/O error";
    case abi::kBatchNoCompatError:
      return "compatibility mode is off";
    default:
      return "unknown cuFile error";
  }
}

std::string describe(abi::Error error) {
  std::string text = fmt::format("error {} ({})", error.err, code_text(error.err));
  if (error.err == abi::kCudaDriverError) text += fmt::format(", CUresult {}", error.cu_err);
  return text;
}

std::string describe_io_result(long result, int saved_errno) {
  if (result == -1) return fmt::format("{} (errno {})", std::strerror(saved_errno), saved_errno);
  long code = -result;
  if (code > 5000) return describe(abi::Error{static_cast<int>(code), 0});
  return fmt::format("{} (errno {})", std::strerror(static_cast<int>(code)), code);
}

}  // namespace ferry::cufile
