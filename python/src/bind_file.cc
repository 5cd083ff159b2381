// ferry.File and ferry.Future. I/O runs with the GIL released. Every request, synchronous or
// not, is a Pending entry that owns the Python buffer until the request is over; the File keeps
// its pending requests so that close() (and garbage collection) waits for them first.
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <vector>

#include "bindings.h"
#include "buffer_view.h"
#include "ferry/file.h"
#include "settings_dict.h"

namespace ferry::python {

namespace {

struct Pending {
  // `buffer` is declared first so that it outlives `future`, whose destructor waits.
  std::shared_ptr<BufferView> buffer;
  IoFuture future;

  ~Pending() {
    if (future.valid() && !future.ready()) {
      py::gil_scoped_release release;
      future.wait();
    }
  }
  // Waits with the GIL released; a strict-mode refusal carries its route report.
  std::size_t get() const {
    py::gil_scoped_release release;
    try {
      return future.get();
    } catch (const RouteError& e) {
      throw RouteErrorWithReport(e, future.route());
    }
  }
};

class PyFuture {
 public:
  explicit PyFuture(std::shared_ptr<Pending> p) : p_(std::move(p)) {}

  std::size_t result(std::optional<double> timeout) const {
    if (timeout) {
      bool ready;
      {
        py::gil_scoped_release release;
        ready = p_->future.wait_for(*timeout);
      }
      if (!ready) {
        PyErr_SetString(PyExc_TimeoutError, "ferry: the request is still running");
        throw py::error_already_set();
      }
    }
    return p_->get();
  }
  bool done() const { return p_->future.ready(); }
  std::uint64_t progress() const { return p_->future.progress(); }
  RouteReport route() const {
    py::gil_scoped_release release;
    return p_->future.route();
  }

 private:
  std::shared_ptr<Pending> p_;
};

std::size_t checked_size(const BufferView& view, std::optional<std::size_t> size) {
  std::size_t n = size.value_or(view.nbytes());
  if (n > view.nbytes()) {
    throw py::value_error("ferry: size " + std::to_string(n) + " is larger than the buffer (" +
                          std::to_string(view.nbytes()) + " bytes)");
  }
  return n;
}

class PyFile {
 public:
  PyFile(const std::string& path, const std::string& mode, bool direct,
         const std::map<std::string, std::string>& settings) {
    FileOptions options;
    options.direct = direct;
    for (const auto& [name, value] : settings) options.settings.set(name, value);
    py::gil_scoped_release release;
    file_ = File(path, mode, std::move(options));
  }
  ~PyFile() { wait_all(); }

  std::shared_ptr<Pending> submit(Op op, const py::object& buf, std::optional<std::size_t> size,
                                  std::uint64_t offset) {
    auto pending = std::make_shared<Pending>();
    pending->buffer = BufferView::of(buf, op == Op::kRead);
    std::size_t n = checked_size(*pending->buffer, size);
    {
      py::gil_scoped_release release;
      pending->future = op == Op::kRead ? file_.pread(pending->buffer->data(), n, offset)
                                        : file_.pwrite(pending->buffer->data(), n, offset);
    }
    forget_finished();
    pending_.push_back(pending);
    return pending;
  }

  // A synchronous request: waits, then lets go of the buffer at once (a bytearray stays
  // resizable). Not a Pending entry: the call holds the buffer itself, and close() from another
  // thread waits for the request in the engine.
  std::size_t run(Op op, const py::object& buf, std::optional<std::size_t> size,
                  std::uint64_t offset) {
    std::shared_ptr<BufferView> view = BufferView::of(buf, op == Op::kRead);
    std::size_t n = checked_size(*view, size);
    py::gil_scoped_release release;  // reacquired before `view` lets go of the buffer
    IoFuture future = op == Op::kRead ? file_.pread(view->data(), n, offset)
                                      : file_.pwrite(view->data(), n, offset);
    try {
      return future.get();
    } catch (const RouteError& e) {
      throw RouteErrorWithReport(e, future.route());
    }
  }

  // Appends from several threads get disjoint ranges (File::append reserves each one).
  std::size_t append(const py::object& buf, std::optional<std::size_t> size) {
    std::shared_ptr<BufferView> view = BufferView::of(buf, false);
    std::size_t n = checked_size(*view, size);
    py::gil_scoped_release release;  // reacquired before `view` lets go of the buffer
    return file_.append(view->data(), n);
  }

  void close() {
    wait_all();
    file_.close();
  }
  File& file() { return file_; }

 private:
  void wait_all() {
    // Taken out first: other threads may submit while this one waits without the GIL.
    std::vector<std::shared_ptr<Pending>> waiting;
    waiting.swap(pending_);
    {
      py::gil_scoped_release release;
      for (const auto& p : waiting) {
        if (p->future.valid()) p->future.wait();
      }
    }
  }  // the buffers are let go here, with the GIL held
  void forget_finished() {
    std::erase_if(pending_, [](const auto& p) { return !p->future.valid() || p->future.ready(); });
  }

  File file_;
  std::vector<std::shared_ptr<Pending>> pending_;  // guarded by the GIL
};

}  // namespace

void bind_file(py::module_& m) {
  using py::arg;
  py::class_<PyFuture>(m, "Future",
                       "An asynchronous request; the buffer is kept alive until it ends.")
      .def("result", &PyFuture::result, arg("timeout") = py::none(),
           "Waits and returns the bytes moved, or raises the request's error.")
      .def("done", &PyFuture::done)
      .def("progress", &PyFuture::progress, "Bytes moved so far by finished tasks.")
      .def("route", &PyFuture::route, "The request's route report (waits).");

  auto none = py::none();
  py::class_<PyFile>(m, "File")
      .def(py::init<const std::string&, const std::string&, bool,
                    const std::map<std::string, std::string>&>(),
           arg("path"), arg("mode") = "r", arg("direct") = false,
           arg("settings") = std::map<std::string, std::string>{})
      .def(
          "read",
          [](PyFile& f, const py::object& buf, std::optional<std::size_t> size,
             std::uint64_t file_offset) { return f.run(Op::kRead, buf, size, file_offset); },
          arg("buf"), arg("size") = none, arg("file_offset") = 0)
      .def(
          "pread",
          [](PyFile& f, const py::object& buf, std::optional<std::size_t> size,
             std::uint64_t file_offset) {
            return PyFuture(f.submit(Op::kRead, buf, size, file_offset));
          },
          arg("buf"), arg("size") = none, arg("file_offset") = 0)
      .def(
          "write",
          [](PyFile& f, const py::object& buf, std::optional<std::size_t> size,
             std::uint64_t file_offset) { return f.run(Op::kWrite, buf, size, file_offset); },
          arg("buf"), arg("size") = none, arg("file_offset") = 0)
      .def(
          "pwrite",
          [](PyFile& f, const py::object& buf, std::optional<std::size_t> size,
             std::uint64_t file_offset) {
            return PyFuture(f.submit(Op::kWrite, buf, size, file_offset));
          },
          arg("buf"), arg("size") = none, arg("file_offset") = 0)
      .def(
          "append",
          [](PyFile& f, const py::object& buf, std::optional<std::size_t> size) {
            return f.append(buf, size);
          },
          arg("buf"), arg("size") = none)
      .def("sync",
           [](PyFile& f) {
             py::gil_scoped_release release;
             f.file().sync();
           })
      .def("close", &PyFile::close)
      .def_property_readonly("size", [](PyFile& f) { return f.file().size(); })
      .def_property_readonly("closed", [](PyFile& f) { return !f.file().is_open(); })
      .def_property_readonly("path", [](PyFile& f) { return f.file().path(); })
      .def_property_readonly("last_route", [](PyFile& f) { return f.file().last_route(); })
      .def_property_readonly("settings",
                             [](PyFile& f) { return settings_dict(f.file().effective_settings()); })
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyFile& f, const py::args&) {
        f.close();
        return false;
      });

  m.def(
      "buffer_info",
      [](const py::object& obj, bool writable) {
        auto view = BufferView::of(obj, writable);
        return py::make_tuple(reinterpret_cast<std::uintptr_t>(view->data()), view->nbytes(),
                              view->exporter());
      },
      arg("obj"), arg("writable") = false,
      "(address, nbytes, exporter) of the memory ferry would use for `obj`.");
}

}  // namespace ferry::python
