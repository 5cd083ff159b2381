// The CUDA driver API, loaded at run time from libcuda.so.1: ferry never links against CUDA.
// This is the only place libcuda is dlopen()ed. The table is loaded once per process and is
// immutable afterwards, so it may be used from any thread.
#pragma once

#include <string>

#include "cuda/cuda_abi.h"
#include "cuda/quick_memory.h"

namespace ferry::cuda {

// One function pointer per driver entry point ferry uses (cuda_abi.h lists them), typed by
// ferry's own declarations, which cuda_abi_check.cc checks against cuda.h where it exists.
struct Driver {
#define FERRY_CUDA_FIELD(field, api, symbol) abi::field##Fn field;
  FERRY_CUDA_DRIVER_API(FERRY_CUDA_FIELD)
#undef FERRY_CUDA_FIELD
};

// The loaded driver, or nullptr when libcuda cannot be loaded or cuInit fails; `why_not` then
// says why ("no CUDA driver: libcuda.so.1 not found"). Loading happens once, on first call.
const Driver* driver_or_null(std::string* why_not = nullptr);

// The driver's table without initialising it, for questions about pointers: until someone in
// the process (ferry, torch, CuPy) has called cuInit, each answers CUDA_ERROR_NOT_INITIALIZED,
// and then no CUDA memory exists. A process that reads into host memory only so never pays
// cuInit (0.1 to 0.2 s on the GPU machine). nullptr, with `why_not`, as driver_or_null().
const Driver* driver_for_queries(std::string* why_not = nullptr);

// The loaded driver; throws ferry::CudaError with the reason when there is none.
const Driver& driver();

// "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)". Usable without a driver.
std::string describe(abi::Result result, const char* what);

// Throws ferry::CudaError describing `result` unless it is abi::kSuccess.
void check(abi::Result result, const char* what);

// Makes device `ordinal`'s primary context current on the calling thread (retaining it once
// per process) and returns it. Throws CudaError for a bad ordinal.
abi::Context use_device(int ordinal);

}  // namespace ferry::cuda
