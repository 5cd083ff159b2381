// Internal to the _ferry extension: the pieces module.cc assembles. Every bind_* function adds
// its classes and functions to the module; none holds state besides the settings scope stack.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "ferry/error.h"
#include "ferry/route.h"

namespace ferry::python {

namespace py = pybind11;

void bind_checkpoint(py::module_& m);
void bind_cufile(py::module_& m);
void bind_errors(py::module_& m);
void bind_file(py::module_& m);
void bind_report(py::module_& m);
void bind_settings(py::module_& m);

// A strict-mode refusal together with the route report of the refused request, so that Python's
// ferry.RouteError can carry it.
class RouteErrorWithReport : public RouteError {
 public:
  RouteErrorWithReport(const RouteError& error, RouteReport report)
      : RouteError(error), report_(std::move(report)) {}
  const RouteReport& report() const { return report_; }

 private:
  RouteReport report_;
};

// Raises `exc` (an instance built by ferry._errors.from_cpp) as the current Python error.
void set_python_error(const py::handle& exc);

}  // namespace ferry::python
