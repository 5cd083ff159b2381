// Internal to the _ferry extension: the pieces module.cc assembles. Every bind_* function adds
// its classes and functions to the module; none holds state besides the settings scope stack.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ferry/checkpoint.h"
#include "ferry/checkpoint_writer.h"
#include "ferry/error.h"
#include "ferry/route.h"

namespace ferry::python {

namespace py = pybind11;

void bind_checkpoint(py::module_& m);
void bind_cufile(py::module_& m);
void bind_dcp(py::module_& m);
void bind_errors(py::module_& m);
void bind_file(py::module_& m);
void bind_report(py::module_& m);
void bind_settings(py::module_& m);
void bind_torch(py::module_& m);

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

// A path argument as the bytes the system gets: str (encoded as os.fsencode does, so a name from
// os.fsdecode of non-UTF-8 bytes comes back exact), bytes, or os.PathLike of either. An embedded
// NUL byte raises ValueError("embedded null byte") as Python's open does: the system would cut
// the path there and open another file.
std::string path_arg(const py::handle& path);
// A path from C++ as Python's str for it (os.fsdecode: undecodable bytes as surrogates).
py::str path_str(const std::string& path);
// Text from C++ (a message that may quote bytes of a file) as a str; bytes that are not UTF-8
// become backslash escapes instead of failing the conversion.
py::str text_str(const std::string& text);
// An integer argument in [0, 2**64): TypeError for a non-integer, ValueError below 0,
// OverflowError above, each naming the argument. None gives nullopt where `none_ok`.
std::optional<std::uint64_t> index_arg(const py::handle& value, const char* name,
                                       bool none_ok = false);

// A load's or save's progress for Python: `callback(done, total)` called with the GIL taken, from
// the thread running it. It holds a reference to `callback`, which the caller keeps alive (the
// std::function may be copied without the GIL: a py::object in it could not be).
ProgressOptions python_progress(const py::object& callback);

// The FileOptions of a `settings={name: text}` argument (SettingError for a bad value) and
// `direct`.
FileOptions file_options_arg(const std::map<std::string, std::string>& settings,
                             bool direct = false);
// The SaveOptions of a save's `durable`, `settings` and `progress` (python_progress) arguments.
SaveOptions save_options_arg(bool durable, const std::map<std::string, std::string>& settings,
                             const py::object& progress = py::none());
// [(name, pointer, nbytes), ...] from Python as Row{name, data, nbytes} (StageItem,
// TorchStorageSource): memory the caller keeps as it is until the call returns.
template <class Row>
std::vector<Row> named_memory(const py::list& rows) {
  std::vector<Row> out;
  out.reserve(rows.size());
  for (const py::handle& row : rows) {
    auto t = row.cast<py::tuple>();
    out.push_back({t[0].cast<std::string>(),
                   reinterpret_cast<const void*>(t[1].cast<std::uintptr_t>()),
                   t[2].cast<std::uint64_t>()});
  }
  return out;
}

// A tensor's dtype name from Python; TypeError naming the tensor where ferry has no such dtype.
Dtype dtype_arg(const std::string& tensor, const std::string& dtype);

// Raises `exc` (an instance built by ferry._errors.from_cpp) as the current Python error.
void set_python_error(const py::handle& exc);

}  // namespace ferry::python
