// ferry::PickleValue: a value of a pickle read by ferry's restricted unpickler (torch.save's
// data.pkl, DCP's .metadata): a plain tree in which classes are only named, never imported or
// called. The unpickler is internal; ferry.torch.load turns the tree into Python objects. Values
// are immutable once parsed; safe to read from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

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
  // kTuple, kList: the items; kDict: key, value, key, value...; kPersistentId: the id, one item;
  // kObject: the key, value pairs SETITEMS put into it (an OrderedDict's).
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

}  // namespace ferry
