#include "core/task_splitter.h"

#include <algorithm>
#include <cassert>

namespace ferry::core {

TaskSplitter::TaskSplitter(std::uint64_t file_offset, std::size_t size, std::size_t task_size)
    : file_offset_(file_offset),
      size_(size),
      task_size_(task_size),
      count_(size == 0 ? 0 : (size - 1) / task_size + 1) {
  assert(task_size > 0);
}

Task TaskSplitter::operator[](std::size_t index) const {
  std::size_t start = index * task_size_;
  return Task{file_offset_ + start, start, std::min(task_size_, size_ - start)};
}

}  // namespace ferry::core
