// Compile-time proof that cufile_abi.h matches NVIDIA's cufile.h, wherever that header exists
// (the GPU machine has it; this file is then compiled with its directory on the include path).
// Without the header this file checks only ferry's own arithmetic.
#include <cstddef>
#include <type_traits>

#include "cufile/cufile_abi.h"

namespace ferry::cufile::abi {

// The sizes cufile_stats.cc relies on when it picks a layout by version.
static_assert(sizeof(StatsLevel1V1) == 512);
static_assert(sizeof(StatsLevel1V2) == 624);
static_assert(sizeof(PerGpuStats) == 248);
static_assert(sizeof(Error) == 8);
static_assert(sizeof(Descr) == 24);

}  // namespace ferry::cufile::abi

#if __has_include(<cufile.h>)
#include <cufile.h>

namespace ferry::cufile::abi {
namespace {

#define FERRY_SAME_FIELD(ours, theirs, field) \
  static_assert(offsetof(ours, field) == offsetof(theirs, field), #theirs "::" #field)
#define FERRY_SAME_VALUE(ours, theirs) \
  static_assert(static_cast<int>(ours) == static_cast<int>(theirs), #theirs)

static_assert(sizeof(Error) == sizeof(CUfileError_t));
FERRY_SAME_FIELD(Error, CUfileError_t, err);
FERRY_SAME_FIELD(Error, CUfileError_t, cu_err);

static_assert(sizeof(Descr) == sizeof(CUfileDescr_t));
FERRY_SAME_FIELD(Descr, CUfileDescr_t, type);
FERRY_SAME_FIELD(Descr, CUfileDescr_t, handle);
FERRY_SAME_FIELD(Descr, CUfileDescr_t, fs_ops);
static_assert(sizeof(Handle) == sizeof(CUfileHandle_t));

FERRY_SAME_VALUE(kHandleTypeOpaqueFd, CU_FILE_HANDLE_TYPE_OPAQUE_FD);
FERRY_SAME_VALUE(kParamAllowCompatMode, CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE);
FERRY_SAME_VALUE(kDriverNotInitialized, CU_FILE_DRIVER_NOT_INITIALIZED);
FERRY_SAME_VALUE(kHandleNotRegistered, CU_FILE_HANDLE_NOT_REGISTERED);
FERRY_SAME_VALUE(kInvalidValue, CU_FILE_INVALID_VALUE);
FERRY_SAME_VALUE(kNvfsSetupError, CU_FILE_NVFS_SETUP_ERROR);
FERRY_SAME_VALUE(kIoError, CU_FILE_IO_ERROR);
FERRY_SAME_VALUE(kCudaDriverError, CU_FILE_CUDA_DRIVER_ERROR);
FERRY_SAME_VALUE(kPlatformNotSupported, CU_FILE_PLATFORM_NOT_SUPPORTED);

// The data path, whose signatures do not involve the structs above.
static_assert(std::is_same_v<decltype(&::cuFileRead), ReadFn>);
static_assert(std::is_same_v<decltype(&::cuFileWrite), WriteFn>);
static_assert(std::is_same_v<decltype(&::cuFileHandleDeregister), HandleDeregisterFn>);

static_assert(sizeof(OpCounter) == sizeof(CUfileOpCounter_t));
static_assert(sizeof(PerGpuStats) == sizeof(CUfilePerGpuStats_t));
FERRY_SAME_FIELD(PerGpuStats, CUfilePerGpuStats_t, n_total_reads);
FERRY_SAME_FIELD(PerGpuStats, CUfilePerGpuStats_t, n_p2p_reads);
FERRY_SAME_FIELD(PerGpuStats, CUfilePerGpuStats_t, n_nvfs_reads);
FERRY_SAME_FIELD(PerGpuStats, CUfilePerGpuStats_t, n_posix_reads);
FERRY_SAME_FIELD(PerGpuStats, CUfilePerGpuStats_t, n_reads_err);
FERRY_SAME_FIELD(PerGpuStats, CUfilePerGpuStats_t, n_total_writes);
FERRY_SAME_FIELD(PerGpuStats, CUfilePerGpuStats_t, n_p2p_writes);
FERRY_SAME_FIELD(PerGpuStats, CUfilePerGpuStats_t, n_nvfs_writes);
FERRY_SAME_FIELD(PerGpuStats, CUfilePerGpuStats_t, n_posix_writes);
FERRY_SAME_FIELD(PerGpuStats, CUfilePerGpuStats_t, n_writes_err);
FERRY_SAME_FIELD(PerGpuStats, CUfilePerGpuStats_t, reg_bytes);

// The installed header declares one level-1 layout; check ours of the same generation. A header
// with vectored I/O counters is the 1.19 layout.
template <typename T>
concept HasVectoredCounters = requires(T t) {
  t.readv_ops;
};

template <typename Theirs, typename Theirs3>
constexpr bool level1_matches() {
  if constexpr (HasVectoredCounters<Theirs>) {
    static_assert(sizeof(StatsLevel1V2) == sizeof(Theirs));
    static_assert(offsetof(StatsLevel1V2, readv_ops) == offsetof(Theirs, readv_ops));
    static_assert(offsetof(StatsLevel1V2, writev_ops) == offsetof(Theirs, writev_ops));
    static_assert(sizeof(StatsLevel3V2) == sizeof(Theirs3));
    static_assert(offsetof(StatsLevel3V2, num_gpus) == offsetof(Theirs3, num_gpus));
    static_assert(offsetof(StatsLevel3V2, per_gpu_stats) == offsetof(Theirs3, per_gpu_stats));
  } else {
    static_assert(sizeof(StatsLevel1V1) == sizeof(Theirs));
    static_assert(sizeof(StatsLevel3V1) == sizeof(Theirs3));
    static_assert(offsetof(StatsLevel3V1, num_gpus) == offsetof(Theirs3, num_gpus));
    static_assert(offsetof(StatsLevel3V1, per_gpu_stats) == offsetof(Theirs3, per_gpu_stats));
  }
  FERRY_SAME_FIELD(StatsLevel1V1, Theirs, read_ops);
  FERRY_SAME_FIELD(StatsLevel1V1, Theirs, read_lat_sum_us);
  static_assert(offsetof(StatsLevel1V1, batch_counters) == offsetof(Theirs, batch_submit_ops));
  static_assert(offsetof(StatsLevel1V1, batch_values) == offsetof(Theirs, batch_read_bytes));
  return true;
}
static_assert(level1_matches<CUfileStatsLevel1_t, CUfileStatsLevel3_t>());
static_assert(sizeof(StatsLevel2<StatsLevel1V1>) - sizeof(StatsLevel1V1) ==
              sizeof(CUfileStatsLevel2_t) - sizeof(CUfileStatsLevel1_t));

#undef FERRY_SAME_FIELD
#undef FERRY_SAME_VALUE

}  // namespace
}  // namespace ferry::cufile::abi
#endif
