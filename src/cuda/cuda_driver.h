// The CUDA driver API, loaded at run time from libcuda.so.1: ferry never links against CUDA.
// This is the only place libcuda is dlopen()ed. The table is loaded once per process and is
// immutable afterwards, so it may be used from any thread.
#pragma once

#include <cuda.h>

#include <string>

#include "cuda/quick_memory.h"

namespace ferry::cuda {

// One function pointer per driver entry point ferry uses, typed from cuda.h so a signature
// mismatch is a compile error. Versioned names (cuMemAlloc_v2, ...) are resolved the same way
// cuda.h's macros spell them.
struct Driver {
  decltype(&::cuInit) Init;
  decltype(&::cuDriverGetVersion) DriverGetVersion;
  decltype(&::cuGetErrorString) GetErrorString;
  decltype(&::cuGetErrorName) GetErrorName;
  decltype(&::cuDeviceGetCount) DeviceGetCount;
  decltype(&::cuDeviceGet) DeviceGet;
  decltype(&::cuDeviceGetName) DeviceGetName;
  decltype(&::cuDeviceGetPCIBusId) DeviceGetPCIBusId;
  decltype(&::cuDeviceTotalMem) DeviceTotalMem;
  decltype(&::cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain;
  decltype(&::cuDevicePrimaryCtxRelease) DevicePrimaryCtxRelease;
  decltype(&::cuDevicePrimaryCtxReset) DevicePrimaryCtxReset;
  decltype(&::cuCtxSetCurrent) CtxSetCurrent;
  decltype(&::cuCtxGetCurrent) CtxGetCurrent;
  decltype(&::cuPointerGetAttributes) PointerGetAttributes;
  decltype(&::cuMemAlloc) MemAlloc;
  decltype(&::cuMemAllocManaged) MemAllocManaged;
  decltype(&::cuMemFree) MemFree;
  decltype(&::cuMemHostAlloc) MemHostAlloc;
  decltype(&::cuMemFreeHost) MemFreeHost;
  decltype(&::cuMemHostRegister) MemHostRegister;
  decltype(&::cuMemHostUnregister) MemHostUnregister;
  decltype(&::cuMemcpyHtoDAsync) MemcpyHtoDAsync;
  decltype(&::cuMemcpyDtoHAsync) MemcpyDtoHAsync;
  decltype(&::cuMemcpyHtoD) MemcpyHtoD;
  decltype(&::cuMemcpyDtoH) MemcpyDtoH;
  decltype(&::cuMemsetD8) MemsetD8;
  decltype(&::cuStreamCreate) StreamCreate;
  decltype(&::cuStreamDestroy) StreamDestroy;
  decltype(&::cuStreamSynchronize) StreamSynchronize;
  decltype(&::cuEventCreate) EventCreate;
  decltype(&::cuEventDestroy) EventDestroy;
  decltype(&::cuEventRecord) EventRecord;
  decltype(&::cuEventSynchronize) EventSynchronize;
};

// The loaded driver, or nullptr when libcuda cannot be loaded or cuInit fails; `why_not` then
// says why ("no CUDA driver: libcuda.so.1 not found"). Loading happens once, on first call.
const Driver* driver_or_null(std::string* why_not = nullptr);

// The loaded driver; throws ferry::CudaError with the reason when there is none.
const Driver& driver();

// "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)". Usable without a driver.
std::string describe(CUresult result, const char* what);

// Throws ferry::CudaError describing `result` unless it is CUDA_SUCCESS.
void check(CUresult result, const char* what);

// Makes device `ordinal`'s primary context current on the calling thread (retaining it once
// per process) and returns it. Throws CudaError for a bad ordinal.
CUcontext use_device(int ordinal);

}  // namespace ferry::cuda
