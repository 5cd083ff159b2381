#include "cuda/cuda_driver.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>

#include <array>
#include <atomic>
#include <mutex>
#include <vector>

#include "base/library.h"
#include "ferry/error.h"

namespace ferry::cuda {
namespace {

struct Loaded {
  Driver table{};
  bool ok = false;
  std::string why_not;
};

void bind(base::Symbols& s, Driver& d) {
#define FERRY_RESOLVE(field, api, symbol) s.required(d.field, symbol);
  FERRY_CUDA_DRIVER_API(FERRY_RESOLVE)
#undef FERRY_RESOLVE
}

Loaded load() {
  // FERRY_CUDA_LIBRARY lets tests point at a library that does not exist, to exercise the
  // "no driver" branch on a machine that has one.
  auto lib = base::load_library<Driver>(base::kCudaLibrary, bind);
  Loaded out{lib.table, lib.load.ok(), {}};
  const std::string& name = lib.load.path;
  if (!lib.load.opened) {
    out.why_not = lib.load.not_found ? fmt::format("no CUDA driver: {} not found", name)
                                     : fmt::format("no CUDA driver: {} could not be loaded ({})",
                                                   name, lib.load.error);
  } else if (!out.ok) {
    out.why_not =
        fmt::format("CUDA driver {} lacks symbols: {}", name, fmt::join(lib.load.missing, ", "));
  }
  return out;
}

// The library and its symbols, without cuInit: enough to ask about a pointer (below).
const Loaded& mapped() {
  // Process-wide: libcuda is loaded once per process (one loader, src/base/library.h).
  static const Loaded instance = load();
  return instance;
}

// Set in a child made by fork() after this process initialised CUDA: CUDA does not survive
// fork, so the child treats the driver as absent, with this reason. Process-wide, as fork() and
// CUDA's state are; an atomic, so that the fork handler needs no lock.
std::atomic<bool> forked_after_init{false};
constexpr const char* kForked =
    "CUDA was initialised in the parent process before fork(), and CUDA cannot be used in a "
    "forked child (host memory still works); start GPU workers with the 'spawn' or "
    "'forkserver' method, or initialise CUDA after fork";

// The library initialised: cuInit, which takes 0.1 to 0.2 s on the GPU machine, once.
const Loaded& loaded() {
  // Process-wide: cuInit holds for the whole process.
  static const Loaded instance = [] {
    Loaded l = mapped();
    if (!l.ok) return l;
    abi::Result init = l.table.Init(0);
    if (init != abi::kSuccess) {
      const char* text = nullptr;
      l.table.GetErrorName(init, &text);
      l.ok = false;
      l.why_not = fmt::format("CUDA driver present but cuInit failed: {} ({})",
                              text ? text : "unknown", static_cast<int>(init));
      return l;
    }
    pthread_atfork(nullptr, nullptr, [] { forked_after_init.store(true); });
    return l;
  }();
  return instance;
}

// `l`'s table, or nullptr (a fork() child of a process that initialised CUDA has none).
const Driver* table_or_null(const Loaded& l) {
  if (forked_after_init.load(std::memory_order_relaxed)) return nullptr;
  return l.ok ? &l.table : nullptr;
}

// The same with the reason: apart, so that the answer alone (every request's pointer query
// asks) saves no registers for a string's assignment (bench/NOTES.md §45).
const Driver* table_or_null(const Loaded& l, std::string* why_not) {
  const Driver* d = table_or_null(l);
  if (d == nullptr && why_not != nullptr) {
    *why_not = forked_after_init.load(std::memory_order_relaxed) ? kForked : l.why_not;
  }
  return d;
}

}  // namespace

const Driver* driver_or_null(std::string* why_not) { return table_or_null(loaded(), why_not); }

const Driver* driver_for_queries(std::string* why_not) {
  if (why_not == nullptr) return table_or_null(mapped());
  return table_or_null(mapped(), why_not);
}

const Driver& driver() {
  const Loaded& l = loaded();
  if (forked_after_init.load(std::memory_order_relaxed)) throw CudaError(kForked, 0);
  if (!l.ok) throw CudaError(l.why_not, 0);
  return l.table;
}

std::string describe(abi::Result result, const char* what) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (const Driver* d = driver_or_null()) {
    d->GetErrorName(result, &name);
    d->GetErrorString(result, &text);
  }
  return fmt::format("{}: {} ({})", what, name ? name : fmt::format("CUresult {}", int(result)),
                     text ? text : "no description");
}

void check(abi::Result result, const char* what) {
  if (result != abi::kSuccess) throw CudaError(describe(result, what), static_cast<int>(result));
}

namespace {
// Primary contexts retained so far, by ordinal: read without a lock by every GPU task.
// Process-wide, as the contexts are (use_device below).
constexpr int kMaxCachedDevices = 64;
std::array<std::atomic<abi::Context>, kMaxCachedDevices> cached_contexts{};
}  // namespace

abi::Context use_device(int ordinal) {
  const Driver& d = driver();
  if (ordinal >= 0 && ordinal < kMaxCachedDevices) {
    if (abi::Context ctx = cached_contexts[ordinal].load(std::memory_order_acquire)) {
      check(d.CtxSetCurrent(ctx), "cuCtxSetCurrent");
      return ctx;
    }
  }
  // Process-wide: a primary context is the process's, one per GPU, shared by every runtime.
  // Leaked on purpose, like the contexts they hold: GPU workers may still call this while the
  // process exits.
  struct Retained {
    std::mutex mu;
    std::vector<abi::Context> contexts;  // under mu: retained once, released at exit
  };
  static auto* retained = new Retained;
  abi::Context ctx = nullptr;
  {
    std::lock_guard lock(retained->mu);
    int count = 0;
    check(d.DeviceGetCount(&count), "cuDeviceGetCount");
    if (ordinal < 0 || ordinal >= count) {
      throw CudaError(
          fmt::format("GPU {} does not exist: this machine has {} GPU(s)", ordinal, count),
          static_cast<int>(abi::kErrorInvalidDevice));
    }
    std::vector<abi::Context>& contexts = retained->contexts;
    if (contexts.size() < static_cast<size_t>(count)) contexts.resize(count, nullptr);
    if (contexts[ordinal] == nullptr) {
      abi::Device dev = 0;
      check(d.DeviceGet(&dev, ordinal), "cuDeviceGet");
      check(d.DevicePrimaryCtxRetain(&contexts[ordinal], dev), "cuDevicePrimaryCtxRetain");
    }
    ctx = contexts[ordinal];
    if (ordinal < kMaxCachedDevices) cached_contexts[ordinal].store(ctx, std::memory_order_release);
  }
  check(d.CtxSetCurrent(ctx), "cuCtxSetCurrent");
  return ctx;
}

}  // namespace ferry::cuda
