#include "cufile/cufile_testing.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

namespace ferry::cufile::testing {
namespace {

std::atomic<bool> host_as_gpu{false};
thread_local int thread_gpu = 0;
std::mutex root_mu;
std::mutex uuid_mu;
std::map<int, std::array<char, 16>>& uuids() {
  static auto* m = new std::map<int, std::array<char, 16>>;
  return *m;
}
std::filesystem::path& root_path() {
  static std::filesystem::path path = "/";
  return path;
}

}  // namespace

void treat_host_as_gpu(bool on) { host_as_gpu.store(on); }
bool host_treated_as_gpu() { return host_as_gpu.load(std::memory_order_relaxed); }

MemoryInfo route_view(const MemoryInfo& memory) {
  if (!host_as_gpu.load(std::memory_order_relaxed) || is_gpu(memory.kind)) return memory;
  return MemoryInfo{MemoryKind::kDevice, thread_gpu, {}};
}

void set_thread_gpu(int device) { thread_gpu = device; }

void set_gpu_uuid(int device, std::optional<std::string_view> uuid) {
  std::lock_guard lock(uuid_mu);
  if (!uuid) {
    uuids().erase(device);
    return;
  }
  std::array<char, 16> bytes{};
  std::copy_n(uuid->data(), std::min(uuid->size(), bytes.size()), bytes.begin());
  uuids()[device] = bytes;
}

std::optional<std::array<char, 16>> gpu_uuid(int device) {
  std::lock_guard lock(uuid_mu);
  auto it = uuids().find(device);
  if (it == uuids().end()) return std::nullopt;
  return it->second;
}

void set_root(const std::filesystem::path& root) {
  std::lock_guard lock(root_mu);
  root_path() = root;
}

std::filesystem::path root() {
  std::lock_guard lock(root_mu);
  return root_path();
}

}  // namespace ferry::cufile::testing
