// A restricted unpickler: a small pickle VM (protocols 2 to 5, the opcodes DCP's .metadata and
// torch.save's data.pkl use) that builds a plain value tree and executes nothing. A class is only
// named, never imported or called: GLOBAL and STACK_GLOBAL outside the caller's allow-list are
// refused. Pure functions over bytes; every failure is a CheckpointError naming the file and the
// byte offset. Values are immutable once parsed; safe to read from several threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::checkpoint {

struct PickleValue;
using PickleRef = std::shared_ptr<const PickleValue>;

struct PickleValue {
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kStr,
    kBytes,
    kTuple,
    kList,
    kDict,
    kClass,
    kObject,
    kPersistentId
  };
  Kind kind = Kind::kNone;
  bool boolean = false;
  std::int64_t integer = 0;
  double real = 0;
  // kStr, kBytes: the text; kClass: "module.name".
  std::string text;
  // kTuple, kList: the items; kDict: key, value, key, value...; kPersistentId: the id, one item.
  std::vector<PickleRef> items;
  // kObject: cls(*args) (REDUCE, NEWOBJ), then BUILD's state when there was one.
  PickleRef cls;
  PickleRef args;
  PickleRef state;
  int depth = 0;  // nesting below this value, bounded by kMaxPickleDepth

  // The value of `key` in a kDict (a str key), or in a kObject's dict state; null when absent.
  const PickleValue* get(std::string_view key) const;
  bool is_class(std::string_view name) const;  // a kObject whose class is `name`
};

inline constexpr int kMaxPickleDepth = 256;
inline constexpr std::size_t kMaxPickleMemo = 1u << 20;

// Whether a class named "module.name" may appear in the pickle.
using PickleAllowList = std::function<bool(std::string_view name)>;

// The value the pickle in `bytes` returns. `file` and `base` (where `bytes` start in it) name the
// place in errors: "dcp FILE: pickle offset N: ...".
PickleRef read_pickle(std::string_view bytes, const PickleAllowList& allowed,
                      const std::string& file, std::uint64_t base = 0);

}  // namespace ferry::checkpoint
