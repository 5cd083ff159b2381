// Pointer classification for the request path: no CUDA headers, no allocation.
#pragma once

#include "ferry/memory.h"

namespace ferry::cuda {

// The kind of memory at a pointer, without the note that says why host memory was assumed, so
// that the common case allocates nothing: `no_driver` when libcuda is absent, `query` the pointer
// query's CUresult (0 is success). with_note() adds the note; classify_memory() is both.
struct QuickMemory {
  MemoryKind kind = MemoryKind::kHostPageable;
  int device = -1;
  bool no_driver = false;
  int query = 0;
  bool noted() const { return no_driver || query != 0; }
};
QuickMemory classify_quick(const void* ptr);
MemoryInfo with_note(const QuickMemory& memory);

}  // namespace ferry::cuda
