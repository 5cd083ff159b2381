#include "cufile/cufile_library.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>

#include "base/variables.h"

namespace ferry::cufile {
namespace {

struct Loaded {
  Library table;
  LoadResult result;
};

Loaded* load_once() {
  auto* out = new Loaded();  // Never freed: pointers into the library live as long as the process.
  const char* name = base::value_of(base::kCufileLibrary);
  if (name == nullptr) name = "libcufile.so.0";
  out->result.path = name;
  out->table.path = name;
  void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::string error = dlerror();
    out->result.why_not = error.find("No such file") != std::string::npos
                              ? fmt::format("{} not found", name)
                              : fmt::format("{} could not be loaded: {}", name, error);
    return out;
  }
  Library& t = out->table;
  auto resolve = [&](auto& slot, const char* symbol, bool required) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(handle, symbol));
    if (slot != nullptr) return;
    (required ? out->result.missing_required : t.missing_optional).push_back(symbol);
  };
  resolve(t.DriverOpen, "cuFileDriverOpen", true);
  // cufile.h maps cuFileDriverClose to the _v2 entry point; older libraries have only the first.
  resolve(t.DriverClose, "cuFileDriverClose_v2", false);
  if (t.DriverClose == nullptr) {
    t.missing_optional.pop_back();
    resolve(t.DriverClose, "cuFileDriverClose", true);
  }
  resolve(t.HandleRegister, "cuFileHandleRegister", true);
  resolve(t.HandleDeregister, "cuFileHandleDeregister", true);
  resolve(t.BufRegister, "cuFileBufRegister", true);
  resolve(t.BufDeregister, "cuFileBufDeregister", true);
  resolve(t.Read, "cuFileRead", true);
  resolve(t.Write, "cuFileWrite", true);
  resolve(t.GetVersion, "cuFileGetVersion", false);
  resolve(t.SetParameterBool, "cuFileSetParameterBool", false);
  resolve(t.SetStatsLevel, "cuFileSetStatsLevel", false);
  resolve(t.StatsStart, "cuFileStatsStart", false);
  resolve(t.GetStatsL3, "cuFileGetStatsL3", false);
  if (!out->result.missing_required.empty()) {
    out->result.why_not =
        fmt::format("{} lacks symbols: {}", name, fmt::join(out->result.missing_required, ", "));
    return out;
  }
  out->result.library = &out->table;
  return out;
}

}  // namespace

const LoadResult& load() {
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
