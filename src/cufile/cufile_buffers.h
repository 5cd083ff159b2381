// The buffers registered with cuFileBufRegister in this process, so that a request into any part
// of one passes cuFile the registered base. Thread-safe.
#pragma once

#include <cstddef>
#include <optional>

namespace ferry::cufile {

struct Registration {
  void* base;
  std::size_t size;
};

// The registration containing `ptr`, if any.
std::optional<Registration> find_registered(const void* ptr);

}  // namespace ferry::cufile
