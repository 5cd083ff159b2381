// Splits a request (file offset, size) into tasks of at most `task_size` bytes, each with its
// offset in the file and in the caller's buffer. The one splitter of ferry: the engine runs its
// tasks, and `plan` and `explain` predict them with task_shape(). Header-only (platform's plan
// uses it without linking the engine); pure arithmetic; thread-safe.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>

namespace ferry::core {

struct Task {
  std::uint64_t file_offset;
  std::size_t buffer_offset;
  std::size_t size;
  // The caller's range this task was cut from, in a gathered request whose ranges name buffers
  // of their own (pread_gather); 0 otherwise. Two such buffers may be separate CUDA allocations,
  // even adjacent in address space, and one copy must not span two: CUDA refuses it.
  std::size_t range = 0;
};

// The tasks of a request as groups of equal size: `full` tasks of `task_size` bytes, then one
// of `rest` bytes when rest > 0.
struct TaskShape {
  std::uint64_t full = 0;
  std::uint64_t task_size = 0;
  std::uint64_t rest = 0;
  std::uint64_t count() const { return full + (rest > 0 ? 1 : 0); }
  std::uint64_t first_size() const { return full > 0 ? task_size : rest; }
  std::uint64_t last_size() const { return rest > 0 ? rest : task_size; }
};

// task_size must be > 0.
inline TaskShape task_shape(std::uint64_t size, std::uint64_t task_size) {
  assert(task_size > 0);
  return TaskShape{size / task_size, task_size, size % task_size};
}

class TaskSplitter {
 public:
  // task_size must be > 0. A zero-sized request has no tasks.
  TaskSplitter(std::uint64_t file_offset, std::size_t size, std::size_t task_size)
      : file_offset_(file_offset),
        size_(size),
        task_size_(task_size),
        count_(task_shape(size, task_size).count()) {}
  std::size_t count() const { return count_; }
  Task operator[](std::size_t index) const {
    const std::size_t start = index * task_size_;
    return Task{file_offset_ + start, start, std::min(task_size_, size_ - start)};
  }

 private:
  std::uint64_t file_offset_;
  std::size_t size_;
  std::size_t task_size_;
  std::size_t count_;
};

}  // namespace ferry::core
