// Splits a request (file offset, size) into tasks of at most `task_size` bytes, each with its
// offset in the file and in the caller's buffer. Pure arithmetic; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::core {

struct Task {
  std::uint64_t file_offset;
  std::size_t buffer_offset;
  std::size_t size;
};

class TaskSplitter {
 public:
  // task_size must be > 0. A zero-sized request has no tasks.
  TaskSplitter(std::uint64_t file_offset, std::size_t size, std::size_t task_size);
  std::size_t count() const { return count_; }
  Task operator[](std::size_t index) const;

 private:
  std::uint64_t file_offset_;
  std::size_t size_;
  std::size_t task_size_;
  std::size_t count_;
};

}  // namespace ferry::core
