// The _ferry extension module. The public face is the pure-Python package `ferry`; names here
// are its building blocks and may change.
#include "bindings.h"

PYBIND11_MODULE(_ferry, m) {
  using namespace ferry::python;
  m.doc() = "ferry's C++ core; use the `ferry` package.";
  m.attr("__version__") = FERRY_VERSION;
#ifdef FERRY_CLI_PATH
  m.attr("cli_path") = FERRY_CLI_PATH;
#else
  m.attr("cli_path") = py::none();
#endif
  bind_errors(m);
  bind_report(m);
  bind_settings(m);
  bind_file(m);
  bind_cufile(m);
  bind_checkpoint(m);
  bind_dcp(m);
  bind_torch(m);
}
