// A restricted unpickler: a small pickle VM (protocols 2 to 5, the opcodes DCP's .metadata and
// torch.save's data.pkl use) that builds a plain value tree and executes nothing. A class is only
// named, never imported or called: GLOBAL and STACK_GLOBAL outside the caller's allow-list are
// refused. Pure functions over bytes; every failure is a CheckpointError naming the file and the
// byte offset. Values are immutable once parsed; safe to read from several threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/pickle_value.h"

namespace ferry::checkpoint {

using ferry::PickleRef;
using ferry::PickleValue;

inline constexpr int kMaxPickleDepth = 256;
inline constexpr std::size_t kMaxPickleMemo = 1u << 20;

// Whether a class named "module.name" may appear in the pickle.
using PickleAllowList = std::function<bool(std::string_view name)>;

// The value the pickle in `bytes` returns. `file` and `base` (where `bytes` start in it) name the
// place in errors: "dcp FILE: pickle offset N: ...".
PickleRef read_pickle(std::string_view bytes, const PickleAllowList& allowed,
                      const std::string& file, std::uint64_t base = 0);

}  // namespace ferry::checkpoint
