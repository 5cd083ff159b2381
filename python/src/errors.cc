// C++ exceptions to Python ones. The Python classes live in ferry/_errors.py (so that they can
// mix ferry.Error with OSError, ValueError or RuntimeError); from_cpp() builds the instance.
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "ferry/printable.h"

namespace ferry::python {

void set_python_error(const py::handle& exc) {
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
}

namespace {

template <typename... Args>
void raise(const char* kind, const std::exception& e, Args&&... attrs) {
  try {
    py::object from_cpp = py::module_::import("ferry._errors").attr("from_cpp");
    set_python_error(from_cpp(kind, text_str(e.what()), std::forward<Args>(attrs)...));
  } catch (const py::error_already_set& err) {
    // ferry._errors failed to import: still raise, with both messages.
    PyErr_SetString(PyExc_RuntimeError,
                    (printable(e.what()) + " (and " + err.what() + ")").c_str());
  }
}

}  // namespace

void bind_errors(py::module_&) {
  using py::arg;
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const RouteErrorWithReport& e) {
      raise("route", e, arg("report") = e.report());
    } catch (const RouteError& e) {
      raise("route", e);
    } catch (const IoError& e) {
      raise("io", e, arg("errno") = e.error_code(), arg("filename") = path_str(e.path()),
            arg("op") = e.op(), arg("offset") = e.offset(), arg("length") = e.length(),
            arg("bytes_done") = e.bytes_done());
    } catch (const SettingError& e) {
      raise("setting", e, arg("setting") = e.setting(), arg("value") = e.value());
    } catch (const CudaError& e) {
      raise("cuda", e, arg("code") = e.code());
    } catch (const Error& e) {
      raise("error", e);
    }
  });
}

}  // namespace ferry::python
