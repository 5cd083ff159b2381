#include "base/library.h"

#include <dlfcn.h>

namespace ferry::base {

void* Symbols::find(const char* name) const { return dlsym(handle_, name); }

void* open_library(const Variable& switch_var, LibraryLoad& load) {
  load.path = read(switch_var).value;
  void* handle = dlopen(load.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    load.error = error != nullptr ? error : "unknown dlopen error";
    load.not_found = load.error.find("No such file") != std::string::npos;
    return nullptr;
  }
  load.opened = true;
  return handle;
}

}  // namespace ferry::base
