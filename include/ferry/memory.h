// Kinds of memory ferry moves bytes into, and Buffer, an owning allocation of any kind (used by
// the CLI, tests, benchmarks and the Python package). GPU kinds need the CUDA driver, loaded at
// run time; without it they throw CudaError("no CUDA driver: ..."). Buffer is move-only and not
// thread-safe; distinct Buffers may be used from distinct threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

enum class MemoryKind { kHostPageable, kHostPinned, kDevice, kManaged };
std::string to_string(MemoryKind kind);
inline bool is_gpu(MemoryKind kind) {
  return kind == MemoryKind::kDevice || kind == MemoryKind::kManaged;
}

// What the CUDA driver says about a pointer. Without a driver every pointer is host pageable
// and `note` says why.
struct MemoryInfo {
  MemoryKind kind = MemoryKind::kHostPageable;
  int device = -1;  // GPU ordinal for device, managed and pinned memory, else -1.
  std::string note;
};
MemoryInfo classify_memory(const void* ptr);

// Asks the kernel for transparent huge pages (madvise MADV_HUGEPAGE) over the whole 2 MiB pages
// inside [data, data + size), as NumPy does for its large arrays. Host memory written whole
// right after it is allocated (a checkpoint's tensors) then takes one page fault per 2 MiB
// instead of 512: the faults are about a third of a page-cached read into fresh memory
// (bench/NOTES.md §28). Best effort: returns the bytes advised, 0 where the range holds no whole
// huge page or the kernel has no THP or refuses. Buffer does it for host allocations >= 2 MiB.
std::size_t advise_huge_pages(void* data, std::size_t size);

class Buffer {
 public:
  // `device` is the GPU ordinal for kDevice and kManaged (and the context for kHostPinned).
  Buffer(MemoryKind kind, std::size_t size, int device = 0);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  MemoryKind kind() const { return kind_; }
  int device() const { return device_; }

  // Copies [offset, offset+size) of the buffer to `dst` in host memory, through the GPU driver
  // where needed. Synchronous.
  void copy_to_host(void* dst, std::size_t size, std::size_t offset = 0) const;
  void copy_from_host(const void* src, std::size_t size, std::size_t offset = 0);
  // Sets every byte to `value`.
  void fill(unsigned char value);

 private:
  void release() noexcept;
  MemoryKind kind_;
  std::size_t size_ = 0;
  int device_ = -1;
  void* data_ = nullptr;
};

struct GpuInfo {
  int ordinal = 0;
  std::string name;
  std::string pci_bus_id;
  std::uint64_t total_memory = 0;
};

// The CUDA driver as this process sees it: loaded or not (and why), its version, the GPUs.
struct CudaStatus {
  bool available = false;
  std::string why_not;
  int driver_version = 0;  // e.g. 13000 for CUDA 13.0
  std::vector<GpuInfo> gpus;
};
CudaStatus cuda_status();

// Waits for the work queued on `stream` (a CUstream; nullptr is the legacy default stream), with
// the driver ferry loaded (FERRY_CUDA_LIBRARY where set). Throws CudaError naming the failure.
void synchronize_stream(void* stream);

}  // namespace ferry
