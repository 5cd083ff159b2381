#include "cufile/cufile_testing.h"

#include <atomic>
#include <mutex>

namespace ferry::cufile::testing {
namespace {

std::atomic<bool> host_as_gpu{false};
std::mutex root_mu;
std::filesystem::path& root_path() {
  static std::filesystem::path path = "/";
  return path;
}

}  // namespace

void treat_host_as_gpu(bool on) { host_as_gpu.store(on); }
bool host_treated_as_gpu() { return host_as_gpu.load(std::memory_order_relaxed); }

MemoryInfo route_view(const MemoryInfo& memory) {
  if (!host_as_gpu.load(std::memory_order_relaxed) || is_gpu(memory.kind)) return memory;
  return MemoryInfo{MemoryKind::kDevice, 0, {}};
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
