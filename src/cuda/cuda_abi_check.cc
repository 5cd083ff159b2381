// Compile-time proof that cuda_abi.h matches NVIDIA's cuda.h, wherever that header exists (the
// build then puts its directory on this file's include path, and this file's alone). Every
// entry point's signature is compared after mapping cuda.h's types onto ferry's, and every
// symbol name against what cuda.h's macros make of the API name. Without the header this file
// checks nothing and says so through checked_against_cuda_version().
#include "cuda/cuda_abi.h"

#if __has_include(<cuda.h>)
#include <cuda.h>

#include <string_view>
#include <type_traits>

namespace ferry::cuda::abi {
namespace {

// cuda.h's type -> ferry's: the enums and the opaque handles map by name, everything else
// (int, size_t, unsigned long long, char, void) is the same type in both.
template <typename T>
struct Ours {
  using type = T;
};
template <>
struct Ours<::CUresult> {
  using type = Result;
};
template <>
struct Ours<::CUpointer_attribute> {
  using type = PointerAttribute;
};
template <>
struct Ours<::CUstreamCaptureStatus> {
  using type = StreamCaptureStatus;
};
template <>
struct Ours<::CUuuid> {
  using type = Uuid;
};
template <>
struct Ours<::CUctx_st> {
  using type = ContextImpl;
};
template <>
struct Ours<::CUstream_st> {
  using type = StreamImpl;
};
template <>
struct Ours<::CUevent_st> {
  using type = EventImpl;
};
template <typename T>
struct Ours<const T> {
  using type = const typename Ours<T>::type;
};
template <typename T>
struct Ours<T*> {
  using type = typename Ours<T>::type*;
};
template <typename R, typename... Args>
struct Ours<R (*)(Args...)> {
  using type = typename Ours<R>::type (*)(typename Ours<Args>::type...);
};

template <typename Theirs, typename Mine>
constexpr bool same_enum() {
  return sizeof(Theirs) == sizeof(Mine) && alignof(Theirs) == alignof(Mine) &&
         std::is_same_v<std::underlying_type_t<Theirs>, std::underlying_type_t<Mine>>;
}

static_assert(same_enum<::CUresult, Result>());
static_assert(same_enum<::CUpointer_attribute, PointerAttribute>());
static_assert(same_enum<::CUmemorytype, MemoryType>());
static_assert(same_enum<::CUstreamCaptureStatus, StreamCaptureStatus>());
static_assert(std::is_same_v<::CUdevice, Device>);
static_assert(std::is_same_v<::CUdeviceptr, DevicePtr>);
static_assert(std::is_same_v<Ours<::CUcontext>::type, Context>);
static_assert(std::is_same_v<Ours<::CUstream>::type, Stream>);
static_assert(std::is_same_v<Ours<::CUevent>::type, Event>);
static_assert(sizeof(::CUuuid) == sizeof(Uuid) && alignof(::CUuuid) == alignof(Uuid));
static_assert(sizeof(::CUuuid::bytes) == sizeof(Uuid::bytes));

#define FERRY_SAME_VALUE(ours, theirs) \
  static_assert(static_cast<long long>(ours) == static_cast<long long>(theirs), #theirs)
FERRY_SAME_VALUE(kSuccess, CUDA_SUCCESS);
FERRY_SAME_VALUE(kErrorOutOfMemory, CUDA_ERROR_OUT_OF_MEMORY);
FERRY_SAME_VALUE(kErrorNotInitialized, CUDA_ERROR_NOT_INITIALIZED);
FERRY_SAME_VALUE(kErrorInvalidDevice, CUDA_ERROR_INVALID_DEVICE);
FERRY_SAME_VALUE(kPointerAttributeMemoryType, CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
FERRY_SAME_VALUE(kPointerAttributeIsManaged, CU_POINTER_ATTRIBUTE_IS_MANAGED);
FERRY_SAME_VALUE(kPointerAttributeDeviceOrdinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
FERRY_SAME_VALUE(kMemoryTypeHost, CU_MEMORYTYPE_HOST);
FERRY_SAME_VALUE(kMemoryTypeDevice, CU_MEMORYTYPE_DEVICE);
FERRY_SAME_VALUE(kMemHostAllocPortable, CU_MEMHOSTALLOC_PORTABLE);
FERRY_SAME_VALUE(kMemHostAllocDeviceMap, CU_MEMHOSTALLOC_DEVICEMAP);
FERRY_SAME_VALUE(kMemHostRegisterPortable, CU_MEMHOSTREGISTER_PORTABLE);
FERRY_SAME_VALUE(kMemAttachGlobal, CU_MEM_ATTACH_GLOBAL);
FERRY_SAME_VALUE(kStreamDefault, CU_STREAM_DEFAULT);
FERRY_SAME_VALUE(kStreamNonBlocking, CU_STREAM_NON_BLOCKING);
FERRY_SAME_VALUE(kEventDisableTiming, CU_EVENT_DISABLE_TIMING);
FERRY_SAME_VALUE(kStreamWaitValueGeq, CU_STREAM_WAIT_VALUE_GEQ);
FERRY_SAME_VALUE(kStreamCaptureStatusNone, CU_STREAM_CAPTURE_STATUS_NONE);
#undef FERRY_SAME_VALUE

// `api` is macro-expanded here exactly as a program compiled against cuda.h would call it, so
// both its signature and the symbol it resolves to are cuda.h's.
#define FERRY_STR_(x) #x
#define FERRY_STR(x) FERRY_STR_(x)
#define FERRY_CHECK_ENTRY_POINT(field, api, symbol)                                          \
  static_assert(std::is_same_v<Ours<decltype(&::api)>::type, field##Fn>, #api " signature"); \
  static_assert(std::string_view(FERRY_STR(api)) == symbol, #api " is " FERRY_STR(api));
FERRY_CUDA_DRIVER_API(FERRY_CHECK_ENTRY_POINT)
#undef FERRY_CHECK_ENTRY_POINT
#undef FERRY_STR
#undef FERRY_STR_

}  // namespace

int checked_against_cuda_version() { return CUDA_VERSION; }

}  // namespace ferry::cuda::abi

#else

namespace ferry::cuda::abi {
int checked_against_cuda_version() { return 0; }
}  // namespace ferry::cuda::abi

#endif
