// ferry's own declarations of the part of cuFile's C ABI it uses, so that ferry builds where
// cufile.h is absent. Written from NVIDIA's public API reference; where cufile.h exists at build
// time, cufile_abi_check.cc checks every size, offset and value below against it. Plain data:
// thread-safe by construction.
//
// The statistics structs changed between releases: cuFile 1.19 (CUDA 13.4) appended readv/writev
// counters to level 1, which moves every level-2 and level-3 field after it. Both layouts are
// declared; cufile_stats.cc picks one from cuFileGetVersion().
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace ferry::cufile::abi {

// CUfileOpError: 0, or 5000 plus a small number. cuFileRead/cuFileWrite return the negation of
// one of these, or -1 with errno for a system error.
enum Code : int {
  kSuccess = 0,
  kDriverNotInitialized = 5001,
  kDriverInvalidProps = 5002,
  kDriverUnsupportedLimit = 5003,
  kDriverVersionMismatch = 5004,
  kDriverVersionReadError = 5005,
  kDriverClosing = 5006,
  kPlatformNotSupported = 5007,
  kIoNotSupported = 5008,
  kDeviceNotSupported = 5009,
  kNvfsDriverError = 5010,
  kCudaDriverError = 5011,
  kCudaPointerInvalid = 5012,
  kCudaMemoryTypeInvalid = 5013,
  kCudaPointerRangeError = 5014,
  kCudaContextMismatch = 5015,
  kInvalidMappingSize = 5016,
  kInvalidMappingRange = 5017,
  kInvalidFileType = 5018,
  kInvalidFileOpenFlag = 5019,
  kDioNotSet = 5020,
  kInvalidValue = 5022,
  kMemoryAlreadyRegistered = 5023,
  kMemoryNotRegistered = 5024,
  kPermissionDenied = 5025,
  kDriverAlreadyOpen = 5026,
  kHandleNotRegistered = 5027,
  kHandleAlreadyRegistered = 5028,
  kDeviceNotFound = 5029,
  kInternalError = 5030,
  kGetNewFdFailed = 5031,
  kNvfsSetupError = 5033,
  kIoDisabled = 5034,
  kBatchSubmitFailed = 5035,
  kGpuMemoryPinningFailed = 5036,
  kBatchFull = 5037,
  kAsyncNotSupported = 5038,
  kIoError = 5044,
  kBatchNoCompatError = 5049,
};

// CUfileError_t: the cuFile code and, for kCudaDriverError, the CUresult. Returned by value
// (8 bytes, in a register on x86_64).
struct Error {
  int err;
  int cu_err;
};

// CUfileFileHandleType: ferry registers plain descriptors only.
enum HandleType : int { kHandleTypeOpaqueFd = 1 };

// CUfileDescr_t.
struct Descr {
  int type;  // HandleType
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;  // user-space file systems only; null for a descriptor
};

using Handle = void*;  // CUfileHandle_t

// CUFileBoolConfigParameter_t values ferry sets.
enum BoolParam : int { kParamAllowCompatMode = 1 };

// CUfileOpCounter_t.
struct OpCounter {
  std::uint64_t ok;
  std::uint64_t err;
};

// CUfileStatsLevel1_t up to cuFile 1.18 (CUDA 13.3).
struct StatsLevel1V1 {
  OpCounter read_ops;
  OpCounter write_ops;
  OpCounter hdl_register_ops;
  OpCounter hdl_deregister_ops;
  OpCounter buf_register_ops;
  OpCounter buf_deregister_ops;
  std::uint64_t read_bytes;
  std::uint64_t write_bytes;
  std::uint64_t read_bw_bytes_per_sec;
  std::uint64_t write_bw_bytes_per_sec;
  std::uint64_t read_lat_avg_us;
  std::uint64_t write_lat_avg_us;
  std::uint64_t read_ops_per_sec;
  std::uint64_t write_ops_per_sec;
  std::uint64_t read_lat_sum_us;
  std::uint64_t write_lat_sum_us;
  OpCounter batch_counters[15];    // batch_submit_ops .. batch_total_submit_ops
  std::uint64_t batch_values[12];  // batch_read_bytes .. last_batch_write_bytes
};

// CUfileStatsLevel1_t from cuFile 1.19 (CUDA 13.4): the same, then vectored I/O counters.
struct StatsLevel1V2 {
  StatsLevel1V1 v1;
  OpCounter readv_ops;
  OpCounter writev_ops;
  std::uint64_t readv_values[10];  // readv_bytes .. writev_lat_sum_us
};

constexpr int kMaxGpus = 16;     // per_gpu_stats entries
constexpr int kGpuUuidLen = 16;  // CUFILE_GPU_UUID_LEN

// CUfilePerGpuStats_t: what cuFile did per GPU. The path counters are per piece cuFile cut a
// request into, not per request.
struct PerGpuStats {
  char uuid[kGpuUuidLen];
  std::uint64_t read_bytes;
  std::uint64_t read_bw_bytes_per_sec;
  std::uint64_t read_utilization;
  std::uint64_t read_duration_us;
  std::uint64_t n_total_reads;
  std::uint64_t n_p2p_reads;
  std::uint64_t n_nvfs_reads;
  std::uint64_t n_posix_reads;
  std::uint64_t n_unaligned_reads;
  std::uint64_t n_dr_reads;
  std::uint64_t n_sparse_regions;
  std::uint64_t n_inline_regions;
  std::uint64_t n_reads_err;
  std::uint64_t writes_bytes;
  std::uint64_t write_bw_bytes_per_sec;
  std::uint64_t write_utilization;
  std::uint64_t write_duration_us;
  std::uint64_t n_total_writes;
  std::uint64_t n_p2p_writes;
  std::uint64_t n_nvfs_writes;
  std::uint64_t n_posix_writes;
  std::uint64_t n_unaligned_writes;
  std::uint64_t n_dr_writes;
  std::uint64_t n_writes_err;
  std::uint64_t n_mmap;
  std::uint64_t n_mmap_ok;
  std::uint64_t n_mmap_err;
  std::uint64_t n_mmap_free;
  std::uint64_t reg_bytes;
};

// CUfileStatsLevel2_t and CUfileStatsLevel3_t over either level-1 layout.
template <typename Level1>
struct StatsLevel2 {
  Level1 basic;
  std::uint64_t read_size_kb_hist[32];
  std::uint64_t write_size_kb_hist[32];
};

template <typename Level1>
struct StatsLevel3 {
  StatsLevel2<Level1> detailed;
  std::uint32_t num_gpus;
  PerGpuStats per_gpu_stats[kMaxGpus];
};

using StatsLevel3V1 = StatsLevel3<StatsLevel1V1>;
using StatsLevel3V2 = StatsLevel3<StatsLevel1V2>;

// The entry points, as the library exports them (C linkage, so the names are plain).
using DriverOpenFn = Error (*)();
using DriverCloseFn = Error (*)();
using GetVersionFn = Error (*)(int* version);
using SetParameterBoolFn = Error (*)(int param, bool value);
using HandleRegisterFn = Error (*)(Handle* fh, Descr* descr);
using HandleDeregisterFn = void (*)(Handle fh);
using BufRegisterFn = Error (*)(const void* base, std::size_t length, int flags);
using BufDeregisterFn = Error (*)(const void* base);
using ReadFn = ssize_t (*)(Handle fh, void* base, std::size_t size, off_t file_offset,
                           off_t base_offset);
using WriteFn = ssize_t (*)(Handle fh, const void* base, std::size_t size, off_t file_offset,
                            off_t base_offset);
using SetStatsLevelFn = Error (*)(int level);
using StatsStartFn = Error (*)();
using GetStatsL3Fn = Error (*)(void* stats);  // a StatsLevel3V1 or V2, by version

}  // namespace ferry::cufile::abi
