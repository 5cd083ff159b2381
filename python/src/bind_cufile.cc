// cuFile's status and buffer registration, bound only when the library has include/ferry/cufile.h
// (so the extension builds at every step of that header's arrival).
#include "bindings.h"

#if __has_include("ferry/cufile.h")
#include "buffer_view.h"
#include "ferry/cufile.h"

namespace ferry::python {

namespace {

// A registration and the Python buffer it pins; the registration ends first.
struct PyRegistered {
  std::shared_ptr<BufferView> view;
  RegisteredBuffer registration;

  void close() {
    py::gil_scoped_release release;
    registration.reset();
  }
};

}  // namespace

void bind_cufile(py::module_& m) {
  using py::arg;
  m.def(
      "cufile_status",
      [](bool open_driver) {
        std::string json;
        {
          py::gil_scoped_release release;
          json = cufile_status(open_driver).to_json();
        }
        return py::module_::import("json").attr("loads")(json);
      },
      arg("open_driver") = true, "What libcufile loaded and why not, as a dict.");

  py::class_<PyRegistered>(m, "RegisteredBuffer",
                           "A GPU buffer registered with cuFile (cuFileBufRegister) until close().")
      .def_property_readonly("registered",
                             [](const PyRegistered& r) { return r.registration.registered(); })
      .def_property_readonly("size", [](const PyRegistered& r) { return r.registration.size(); })
      .def("close", &PyRegistered::close, "Deregisters the buffer.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyRegistered& r, const py::args&) {
        r.close();
        return false;
      });
  m.def(
      "register_buffer",
      [](const py::object& array, int flags) {
        auto r = std::make_unique<PyRegistered>();
        r->view = BufferView::of(array, false);
        py::gil_scoped_release release;
        r->registration = register_buffer(r->view->data(), r->view->nbytes(), flags);
        return r;
      },
      arg("array"), arg("flags") = 0,
      "Registers a GPU array with cuFile (cuFileBufRegister) until close() or the end of a "
      "`with` block.");
}

}  // namespace ferry::python

#else

namespace ferry::python {
void bind_cufile(py::module_&) {}
}  // namespace ferry::python

#endif
