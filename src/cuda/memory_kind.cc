// Pointer classification, Buffer and the CUDA status report: the public face of the libcuda
// loader.
#include <fmt/format.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "cuda/cuda_driver.h"
#include "ferry/error.h"
#include "ferry/memory.h"
#include "ferry/settings.h"

namespace ferry {

namespace abi = cuda::abi;

std::string to_string(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHostPageable:
      return "host";
    case MemoryKind::kHostPinned:
      return "host-pinned";
    case MemoryKind::kDevice:
      return "gpu";
    case MemoryKind::kManaged:
      return "gpu-managed";
  }
  return "?";
}

namespace cuda {

QuickMemory classify_quick(const void* ptr) {
  QuickMemory q;
  const cuda::Driver* d = cuda::driver_for_queries();
  if (d == nullptr) {
    q.no_driver = true;
    return q;
  }
  unsigned int memory_type = 0;
  int ordinal = -1;
  unsigned int managed = 0;
  abi::PointerAttribute attrs[] = {abi::kPointerAttributeMemoryType,
                                   abi::kPointerAttributeDeviceOrdinal,
                                   abi::kPointerAttributeIsManaged};
  void* values[] = {&memory_type, &ordinal, &managed};
  // cuPointerGetAttributes succeeds for unknown (pageable) pointers and leaves memory_type 0.
  const abi::Result r =
      d->PointerGetAttributes(3, attrs, values, reinterpret_cast<abi::DevicePtr>(ptr));
  // Nobody in this process has initialised CUDA: no pointer in it can be CUDA memory.
  if (r == abi::kErrorNotInitialized) return q;
  q.query = static_cast<int>(r);
  if (r != abi::kSuccess) return q;
  if (managed != 0) {
    q.kind = MemoryKind::kManaged;
  } else if (memory_type == abi::kMemoryTypeDevice) {
    q.kind = MemoryKind::kDevice;
  } else if (memory_type == abi::kMemoryTypeHost) {
    q.kind = MemoryKind::kHostPinned;
  } else {
    return q;
  }
  q.device = ordinal;
  return q;
}

MemoryInfo with_note(const QuickMemory& q) {
  MemoryInfo info{q.kind, q.device, {}};
  if (q.no_driver) {
    cuda::driver_for_queries(&info.note);
  } else if (q.query != 0) {
    info.note = cuda::describe(static_cast<abi::Result>(q.query), "cuPointerGetAttributes");
  }
  return info;
}

}  // namespace cuda

MemoryInfo classify_memory(const void* ptr) { return cuda::with_note(cuda::classify_quick(ptr)); }

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
}  // namespace

std::size_t advise_huge_pages(void* data, std::size_t size) {
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  if (begin > UINTPTR_MAX - size) return 0;
  const std::uintptr_t first = (begin + kHugePage - 1) / kHugePage * kHugePage;
  const std::uintptr_t last = (begin + size) / kHugePage * kHugePage;
  if (first >= last) return 0;
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) != 0) return 0;
  return last - first;
}

Buffer::Buffer(MemoryKind kind, std::size_t size, int device) : kind_(kind), size_(size) {
  if (size == 0) return;
  switch (kind) {
    case MemoryKind::kHostPageable:
      // Page-aligned so that the same buffer can serve O_DIRECT tests. The round-up must not wrap
      // (a size near 2^64 once became a 0-byte allocation that claimed to hold it).
      if (size > SIZE_MAX - 4095) {
        throw Error(
            fmt::format("cannot allocate {} B of host memory: larger than the address "
                        "space",
                        size));
      }
      if (size >= kHugePage) {
        // Aligned to a huge page, so that every whole 2 MiB of the buffer can be one; the tail
        // past the last whole one keeps 4 KiB pages (rounding the size up instead would cost up
        // to 2 MiB of memory a buffer). The alignment costs address space, not memory.
        data_ = std::aligned_alloc(kHugePage, (size + kHugePage - 1) / kHugePage * kHugePage);
        if (data_ != nullptr) advise_huge_pages(data_, size);
      } else {
        data_ = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
      }
      if (data_ == nullptr) {
        throw Error(
            fmt::format("cannot allocate {} ({} B) of host memory", format_size(size), size));
      }
      return;
    case MemoryKind::kHostPinned:
      cuda::use_device(device);
      cuda::check(cuda::driver().MemHostAlloc(&data_, size, abi::kMemHostAllocPortable),
                  "cuMemHostAlloc");
      device_ = device;
      return;
    case MemoryKind::kDevice: {
      cuda::use_device(device);
      abi::DevicePtr p = 0;
      cuda::check(cuda::driver().MemAlloc(&p, size),
                  fmt::format("cuMemAlloc {} B on GPU {}", size, device).c_str());
      data_ = reinterpret_cast<void*>(p);
      device_ = device;
      return;
    }
    case MemoryKind::kManaged: {
      cuda::use_device(device);
      abi::DevicePtr p = 0;
      cuda::check(cuda::driver().MemAllocManaged(&p, size, abi::kMemAttachGlobal),
                  "cuMemAllocManaged");
      data_ = reinterpret_cast<void*>(p);
      device_ = device;
      return;
    }
  }
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : kind_(other.kind_), size_(other.size_), device_(other.device_), data_(other.data_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    kind_ = other.kind_;
    size_ = other.size_;
    device_ = other.device_;
    data_ = other.data_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void Buffer::release() noexcept {
  if (data_ == nullptr) return;
  switch (kind_) {
    case MemoryKind::kHostPageable:
      std::free(data_);
      break;
    case MemoryKind::kHostPinned:
      cuda::driver().MemFreeHost(data_);
      break;
    case MemoryKind::kDevice:
    case MemoryKind::kManaged:
      // A destructor must not throw: if the context is gone (reset, destroyed), so is the memory.
      try {
        cuda::use_device(device_);
        cuda::driver().MemFree(reinterpret_cast<abi::DevicePtr>(data_));
      } catch (const CudaError&) {
      }
      break;
  }
  data_ = nullptr;
}

namespace {
void check_range(std::size_t buffer_size, std::size_t size, std::size_t offset) {
  if (offset > buffer_size || size > buffer_size - offset) {
    throw Error(fmt::format("buffer range offset={} len={} exceeds the buffer's {} bytes", offset,
                            size, buffer_size));
  }
}
}  // namespace

void Buffer::copy_to_host(void* dst, std::size_t size, std::size_t offset) const {
  check_range(size_, size, offset);
  if (size == 0) return;
  char* src = static_cast<char*>(data_) + offset;
  if (!is_gpu(kind_)) {
    std::memcpy(dst, src, size);
    return;
  }
  cuda::use_device(device_);
  cuda::check(cuda::driver().MemcpyDtoH(dst, reinterpret_cast<abi::DevicePtr>(src), size),
              "cuMemcpyDtoH");
}

void Buffer::copy_from_host(const void* src, std::size_t size, std::size_t offset) {
  check_range(size_, size, offset);
  if (size == 0) return;
  char* dst = static_cast<char*>(data_) + offset;
  if (!is_gpu(kind_)) {
    std::memcpy(dst, src, size);
    return;
  }
  cuda::use_device(device_);
  cuda::check(cuda::driver().MemcpyHtoD(reinterpret_cast<abi::DevicePtr>(dst), src, size),
              "cuMemcpyHtoD");
}

void Buffer::fill(unsigned char value) {
  if (size_ == 0) return;
  if (!is_gpu(kind_)) {
    std::memset(data_, value, size_);
    return;
  }
  cuda::use_device(device_);
  cuda::check(cuda::driver().MemsetD8(reinterpret_cast<abi::DevicePtr>(data_), value, size_),
              "cuMemsetD8");
}

void synchronize_stream(void* stream) {
  const cuda::Driver& d = cuda::driver();
  // The legacy default stream is the current context's: GPU 0's primary one where the calling
  // thread has none (CuPy and PyTorch make it current on the threads they use).
  abi::Context current = nullptr;
  d.CtxGetCurrent(&current);
  if (current == nullptr) cuda::use_device(0);
  cuda::check(d.StreamSynchronize(static_cast<abi::Stream>(stream)), "cuStreamSynchronize");
}

CudaStatus cuda_status() {
  CudaStatus status;
  const cuda::Driver* d = cuda::driver_or_null(&status.why_not);
  if (d == nullptr) return status;
  status.available = true;
  d->DriverGetVersion(&status.driver_version);
  int count = 0;
  if (abi::Result r = d->DeviceGetCount(&count); r != abi::kSuccess) {
    status.why_not = cuda::describe(r, "cuDeviceGetCount");
    return status;
  }
  for (int i = 0; i < count; ++i) {
    abi::Device dev = 0;
    if (d->DeviceGet(&dev, i) != abi::kSuccess) continue;
    GpuInfo gpu;
    gpu.ordinal = i;
    char text[256] = {};
    if (d->DeviceGetName(text, sizeof text, dev) == abi::kSuccess) gpu.name = text;
    if (d->DeviceGetPCIBusId(text, sizeof text, dev) == abi::kSuccess) gpu.pci_bus_id = text;
    size_t total = 0;
    if (d->DeviceTotalMem(&total, dev) == abi::kSuccess) gpu.total_memory = total;
    status.gpus.push_back(gpu);
  }
  if (count == 0) status.why_not = "the CUDA driver sees no GPU";
  return status;
}

}  // namespace ferry
