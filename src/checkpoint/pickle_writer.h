// A writer of pickles (protocol 2) from the opcodes up: the caller emits a value as the pickle VM
// would build it (a GLOBAL, a MARK, items, TUPLE...), and finish() returns the bytes. It names
// classes without knowing them; no memo is written, so every value is emitted where it is used.
// The reading side is pickle_reader.h. Not thread-safe: one owner.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ferry::checkpoint {

class PickleWriter {
 public:
  PickleWriter();                                               // PROTO 2
  void global(std::string_view module, std::string_view name);  // GLOBAL: the class, named
  void mark();                                                  // MARK
  void tuple();                                                 // TUPLE of the items since MARK
  void empty_tuple();
  void empty_dict();
  void set_items();  // SETITEMS: the key, value pairs since MARK into the dict below them
  void empty_list();
  void appends();  // APPENDS: the items since MARK onto the list below them
  void integer(std::int64_t v);
  void boolean(bool v);
  void none();
  void str(std::string_view s);  // BINUNICODE (the caller's bytes, UTF-8)
  void persistent_id();          // BINPERSID: the value on top is a persistent id
  void reduce();                 // REDUCE: callable(*args)
  void new_object();             // NEWOBJ: cls.__new__(cls, *args)
  void build();                  // BUILD: the state on top set into the object below it
  std::string finish();          // STOP; the pickle's bytes

 private:
  std::string out_;
};

}  // namespace ferry::checkpoint
