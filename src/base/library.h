// The one loader of the libraries ferry dlopens and never links (libcuda, libcufile, libcurl,
// libcrypto): each owner declares a table of typed function pointers, and load_library() opens
// the file its FERRY_*_LIBRARY switch names, else the switch's default (variables.h; read here,
// once per load), and fills the table. Its owner loads it once, into a function-local static; the
// library stays open for the life of the process, as pointers into it do. Loading is not
// thread-safe; the filled table is immutable.
#pragma once

#include <string>
#include <vector>

#include "base/variables.h"

namespace ferry::base {

// What opening a library and looking up its symbols found.
struct LibraryLoad {
  std::string path;  // as passed to dlopen: the switch's value, else its default
  bool opened = false;
  bool not_found = false;                     // dlopen said "No such file"
  std::string error;                          // dlerror() when it could not be opened
  std::vector<std::string> missing;           // required symbols it lacks
  std::vector<std::string> missing_optional;  // optional ones, whose slots stay null
  bool ok() const { return opened && missing.empty(); }
};

// Looks symbols up in an open library, recording those it lacks.
class Symbols {
 public:
  Symbols(void* handle, LibraryLoad& load) : handle_(handle), load_(load) {}
  template <class Fn>
  void required(Fn& slot, const char* name) {
    slot = reinterpret_cast<Fn>(find(name));
    if (slot == nullptr) load_.missing.emplace_back(name);
  }
  template <class Fn>
  void optional(Fn& slot, const char* name) {
    slot = reinterpret_cast<Fn>(find(name));
    if (slot == nullptr) load_.missing_optional.emplace_back(name);
  }
  // `name`, else (an older library) `fallback`, which is then required.
  template <class Fn>
  void required_either(Fn& slot, const char* name, const char* fallback) {
    slot = reinterpret_cast<Fn>(find(name));
    if (slot == nullptr) required(slot, fallback);
  }

 private:
  void* find(const char* name) const;
  void* handle_;
  LibraryLoad& load_;
};

// Opens the library that `switch_var` names, else its default; null (and `load` says why) when
// it cannot be opened.
void* open_library(const Variable& switch_var, LibraryLoad& load);

template <class Table>
struct Library {
  Table table{};
  LibraryLoad load;
};

// Opens the library and has bind(Symbols&, Table&) look up its table's symbols.
template <class Table, class Bind>
Library<Table> load_library(const Variable& switch_var, Bind bind) {
  Library<Table> lib;
  if (void* handle = open_library(switch_var, lib.load)) {
    Symbols symbols(handle, lib.load);
    bind(symbols, lib.table);
  }
  return lib;
}

}  // namespace ferry::base
