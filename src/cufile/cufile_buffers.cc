// ferry::register_buffer and the registry the cuFile backend consults.
#include "cufile/cufile_buffers.h"

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "cufile/cufile_driver.h"
#include "ferry/cufile.h"
#include "ferry/error.h"
#include "ferry/settings.h"

namespace ferry {
namespace cufile {
namespace {

// Process-wide, as cuFileBufRegister is: a buffer registered for one runtime's Files serves
// every runtime's. Leaked, like the driver's state.
struct Registered {
  std::shared_mutex mu;
  std::map<std::uintptr_t, std::size_t> by_address;  // under mu: start -> size
};
Registered& registry() {
  static auto* r = new Registered;
  return *r;
}

}  // namespace

std::optional<Registration> find_registered(const void* ptr) {
  auto p = reinterpret_cast<std::uintptr_t>(ptr);
  Registered& reg = registry();
  std::shared_lock lock(reg.mu);
  const auto& r = reg.by_address;
  auto it = r.upper_bound(p);
  if (it == r.begin()) return std::nullopt;
  --it;
  if (p >= it->first + it->second) return std::nullopt;
  return Registration{reinterpret_cast<void*>(it->first), it->second};
}

}  // namespace cufile

RegisteredBuffer register_buffer(void* data, std::size_t size, int flags) {
  if (data == nullptr || size == 0) {
    throw Error(fmt::format("cuFileBufRegister({}, {} B): empty buffer", data, size));
  }
  cufile::DriverResult d = cufile::open_driver(settings().require == Require::kGds);
  if (d.library == nullptr) {
    throw Error(fmt::format("cuFileBufRegister({}, {}): cuFile is unavailable: {}", data,
                            format_size(size), d.why_not));
  }
  cufile::abi::Error e = d.library->BufRegister(data, size, flags);
  if (e.err != cufile::abi::kSuccess) {
    throw Error(fmt::format("cuFileBufRegister({}, {}) failed: {}", data, format_size(size),
                            cufile::describe(e)));
  }
  cufile::Registered& reg = cufile::registry();
  std::unique_lock lock(reg.mu);
  reg.by_address[reinterpret_cast<std::uintptr_t>(data)] = size;
  return RegisteredBuffer(data, size);
}

RegisteredBuffer::~RegisteredBuffer() { reset(); }

RegisteredBuffer::RegisteredBuffer(RegisteredBuffer&& other) noexcept
    : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

RegisteredBuffer& RegisteredBuffer::operator=(RegisteredBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }
  return *this;
}

void RegisteredBuffer::reset() {
  if (data_ == nullptr) return;
  {
    cufile::Registered& reg = cufile::registry();
    std::unique_lock lock(reg.mu);
    reg.by_address.erase(reinterpret_cast<std::uintptr_t>(data_));
  }
  const cufile::LoadResult& l = cufile::load();
  if (l.library != nullptr && !cufile::driver_closed()) l.library->BufDeregister(data_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace ferry
