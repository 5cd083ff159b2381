// ferry's own declarations of the part of the CUDA driver API it uses, so that ferry builds
// where cuda.h is absent (libcuda is dlopen()ed at run time; nothing links against it). Written
// from NVIDIA's public driver API reference; where cuda.h exists at build time,
// cuda_abi_check.cc checks every type, value, signature and symbol name below against it.
// Plain declarations: thread-safe by construction.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::cuda::abi {

// CUresult. Only the values ferry names are listed; the driver may return any other, which the
// fixed underlying type holds as it is. The underlying types are those compilers give cuda.h's
// enums (unsigned int: every enumerator is non-negative).
enum Result : unsigned int {
  kSuccess = 0,
  kErrorOutOfMemory = 2,
  kErrorNotInitialized = 3,
  kErrorInvalidDevice = 101,
};

using Device = int;                    // CUdevice
using DevicePtr = unsigned long long;  // CUdeviceptr (x86_64 and aarch64: 64 bits)
struct ContextImpl;                    // struct CUctx_st
struct StreamImpl;                     // struct CUstream_st
struct EventImpl;                      // struct CUevent_st
using Context = ContextImpl*;          // CUcontext
using Stream = StreamImpl*;            // CUstream
using Event = EventImpl*;              // CUevent

// CUuuid: a GPU's 16-byte UUID, as cuDeviceGetUuid writes it and cuFile's per-GPU counters name
// the GPU they count.
struct Uuid {
  char bytes[16];
};

// CUpointer_attribute.
enum PointerAttribute : unsigned int {
  kPointerAttributeMemoryType = 2,
  kPointerAttributeIsManaged = 8,
  kPointerAttributeDeviceOrdinal = 9,
};

// CUmemorytype, the value cuPointerGetAttributes writes for kPointerAttributeMemoryType.
enum MemoryType : unsigned int {
  kMemoryTypeHost = 1,
  kMemoryTypeDevice = 2,
};

// Flags: CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTREGISTER_PORTABLE, CU_MEM_ATTACH_GLOBAL,
// CUstream_flags and CUevent_flags.
constexpr unsigned int kMemHostAllocPortable = 0x1;
constexpr unsigned int kMemHostAllocDeviceMap = 0x2;
constexpr unsigned int kMemHostRegisterPortable = 0x1;
constexpr unsigned int kMemAttachGlobal = 0x1;
constexpr unsigned int kStreamDefault = 0x0;
constexpr unsigned int kStreamNonBlocking = 0x1;
constexpr unsigned int kEventDisableTiming = 0x2;
// CU_STREAM_WAIT_VALUE_GEQ: wait until (int32_t)(*addr - value) >= 0.
constexpr unsigned int kStreamWaitValueGeq = 0x0;

// The entry points, as cuda.h declares them (CUDAAPI is empty on Linux).
using InitFn = Result (*)(unsigned int flags);
using DriverGetVersionFn = Result (*)(int* version);
using GetErrorStringFn = Result (*)(Result error, const char** text);
using GetErrorNameFn = Result (*)(Result error, const char** text);
using DeviceGetCountFn = Result (*)(int* count);
using DeviceGetFn = Result (*)(Device* device, int ordinal);
using DeviceGetNameFn = Result (*)(char* name, int len, Device device);
using DeviceGetPCIBusIdFn = Result (*)(char* bus_id, int len, Device device);
using DeviceTotalMemFn = Result (*)(std::size_t* bytes, Device device);
using DeviceGetUuidFn = Result (*)(Uuid* uuid, Device device);
using DevicePrimaryCtxRetainFn = Result (*)(Context* context, Device device);
using DevicePrimaryCtxReleaseFn = Result (*)(Device device);
using DevicePrimaryCtxResetFn = Result (*)(Device device);
using CtxSetCurrentFn = Result (*)(Context context);
using CtxGetCurrentFn = Result (*)(Context* context);
using PointerGetAttributesFn = Result (*)(unsigned int count, PointerAttribute* attributes,
                                          void** data, DevicePtr ptr);
using MemAllocFn = Result (*)(DevicePtr* ptr, std::size_t bytes);
using MemAllocManagedFn = Result (*)(DevicePtr* ptr, std::size_t bytes, unsigned int flags);
using MemFreeFn = Result (*)(DevicePtr ptr);
using MemHostAllocFn = Result (*)(void** ptr, std::size_t bytes, unsigned int flags);
using MemFreeHostFn = Result (*)(void* ptr);
using MemHostRegisterFn = Result (*)(void* ptr, std::size_t bytes, unsigned int flags);
using MemHostUnregisterFn = Result (*)(void* ptr);
using MemcpyHtoDAsyncFn = Result (*)(DevicePtr dst, const void* src, std::size_t bytes,
                                     Stream stream);
using MemcpyDtoHAsyncFn = Result (*)(void* dst, DevicePtr src, std::size_t bytes, Stream stream);
using MemcpyHtoDFn = Result (*)(DevicePtr dst, const void* src, std::size_t bytes);
using MemcpyDtoHFn = Result (*)(void* dst, DevicePtr src, std::size_t bytes);
using MemsetD8Fn = Result (*)(DevicePtr dst, unsigned char value, std::size_t count);
using StreamCreateFn = Result (*)(Stream* stream, unsigned int flags);
using StreamDestroyFn = Result (*)(Stream stream);
using StreamSynchronizeFn = Result (*)(Stream stream);
using EventCreateFn = Result (*)(Event* event, unsigned int flags);
using EventDestroyFn = Result (*)(Event event);
using EventRecordFn = Result (*)(Event event, Stream stream);
using EventSynchronizeFn = Result (*)(Event event);
using StreamWaitEventFn = Result (*)(Stream stream, Event event, unsigned int flags);
using StreamGetCtxFn = Result (*)(Stream stream, Context* context);
// CUstreamCaptureStatus: only "not capturing" is named.
enum StreamCaptureStatus : unsigned int { kStreamCaptureStatusNone = 0 };
using StreamIsCapturingFn = Result (*)(Stream stream, StreamCaptureStatus* status);
using HostFn = void (*)(void* user_data);  // CUhostFn
using LaunchHostFuncFn = Result (*)(Stream stream, HostFn fn, void* user_data);
using StreamWaitValue32Fn = Result (*)(Stream stream, DevicePtr address, std::uint32_t value,
                                       unsigned int flags);
using MemHostGetDevicePointerFn = Result (*)(DevicePtr* device_ptr, void* host_ptr,
                                             unsigned int flags);

// X(Field, api, "symbol") for every entry point: the Driver table's field (typed FieldFn), the
// name in cuda.h and the symbol libcuda exports for it, which for a versioned entry point is
// what cuda.h's #define of the name spells (cuMemAlloc -> cuMemAlloc_v2; the legacy-stream
// names, without CUDA_API_PER_THREAD_DEFAULT_STREAM).
#define FERRY_CUDA_DRIVER_API(X)                                                        \
  X(Init, cuInit, "cuInit")                                                             \
  X(DriverGetVersion, cuDriverGetVersion, "cuDriverGetVersion")                         \
  X(GetErrorString, cuGetErrorString, "cuGetErrorString")                               \
  X(GetErrorName, cuGetErrorName, "cuGetErrorName")                                     \
  X(DeviceGetCount, cuDeviceGetCount, "cuDeviceGetCount")                               \
  X(DeviceGet, cuDeviceGet, "cuDeviceGet")                                              \
  X(DeviceGetName, cuDeviceGetName, "cuDeviceGetName")                                  \
  X(DeviceGetPCIBusId, cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId")                      \
  X(DeviceTotalMem, cuDeviceTotalMem, "cuDeviceTotalMem_v2")                            \
  X(DeviceGetUuid, cuDeviceGetUuid, "cuDeviceGetUuid_v2")                               \
  X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")       \
  X(DevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2") \
  X(DevicePrimaryCtxReset, cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset_v2")       \
  X(CtxSetCurrent, cuCtxSetCurrent, "cuCtxSetCurrent")                                  \
  X(CtxGetCurrent, cuCtxGetCurrent, "cuCtxGetCurrent")                                  \
  X(PointerGetAttributes, cuPointerGetAttributes, "cuPointerGetAttributes")             \
  X(MemAlloc, cuMemAlloc, "cuMemAlloc_v2")                                              \
  X(MemAllocManaged, cuMemAllocManaged, "cuMemAllocManaged")                            \
  X(MemFree, cuMemFree, "cuMemFree_v2")                                                 \
  X(MemHostAlloc, cuMemHostAlloc, "cuMemHostAlloc")                                     \
  X(MemFreeHost, cuMemFreeHost, "cuMemFreeHost")                                        \
  X(MemHostRegister, cuMemHostRegister, "cuMemHostRegister_v2")                         \
  X(MemHostUnregister, cuMemHostUnregister, "cuMemHostUnregister")                      \
  X(MemcpyHtoDAsync, cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")                         \
  X(MemcpyDtoHAsync, cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")                         \
  X(MemcpyHtoD, cuMemcpyHtoD, "cuMemcpyHtoD_v2")                                        \
  X(MemcpyDtoH, cuMemcpyDtoH, "cuMemcpyDtoH_v2")                                        \
  X(MemsetD8, cuMemsetD8, "cuMemsetD8_v2")                                              \
  X(StreamCreate, cuStreamCreate, "cuStreamCreate")                                     \
  X(StreamDestroy, cuStreamDestroy, "cuStreamDestroy_v2")                               \
  X(StreamSynchronize, cuStreamSynchronize, "cuStreamSynchronize")                      \
  X(EventCreate, cuEventCreate, "cuEventCreate")                                        \
  X(EventDestroy, cuEventDestroy, "cuEventDestroy_v2")                                  \
  X(EventRecord, cuEventRecord, "cuEventRecord")                                        \
  X(EventSynchronize, cuEventSynchronize, "cuEventSynchronize")                         \
  X(StreamWaitEvent, cuStreamWaitEvent, "cuStreamWaitEvent")                            \
  X(StreamGetCtx, cuStreamGetCtx, "cuStreamGetCtx")                                     \
  X(StreamIsCapturing, cuStreamIsCapturing, "cuStreamIsCapturing")                      \
  X(LaunchHostFunc, cuLaunchHostFunc, "cuLaunchHostFunc")                               \
  X(StreamWaitValue32, cuStreamWaitValue32, "cuStreamWaitValue32_v2")                   \
  X(MemHostGetDevicePointer, cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2")

// The CUDA_VERSION of the cuda.h these declarations were checked against when this library was
// built, or 0 where the build had no cuda.h (then nothing was checked).
int checked_against_cuda_version();

}  // namespace ferry::cuda::abi
