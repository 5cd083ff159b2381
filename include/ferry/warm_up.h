// ferry::warm_up: pays, ahead of time, what a process's first read into GPU memory would pay
// itself: the GPU's context, the worker threads, and each worker's pinned staging buffers with
// their copy stream. Optional: without it the first request pays these costs (a few
// milliseconds of staging on the GPU machine since it moved to registered huge pages;
// bench/NOTES.md §10).
// Thread-safe; calling it again costs nothing.
#pragma once

namespace ferry {

// Prepares reads into GPU `device` with the current settings (nthreads workers, staging buffers
// of bounce_buffer_size), and the host_nthreads workers for host memory. Throws CudaError when
// there is no driver or no such GPU.
void warm_up(int device = 0);

}  // namespace ferry
