// _ferry.Checkpoint and _ferry.LoadReport: the safetensors loader for the Python package
// (ferry.safetensors, ferry.load_checkpoint). Python allocates every destination with its own
// framework; read_into takes them all and reads with the GIL released, one gathered request per
// shard. CheckpointError becomes ferry.CheckpointError (a ValueError).
#include <pybind11/stl.h>

#include <map>
#include <vector>

#include "bindings.h"
#include "buffer_view.h"
#include "ferry/checkpoint.h"
#include "ferry/printable.h"

namespace ferry::python {

namespace {

py::tuple tensor_tuple(const TensorInfo& t) {
  py::tuple shape(t.shape.size());
  for (std::size_t i = 0; i < t.shape.size(); ++i) shape[i] = t.shape[i];
  return py::make_tuple(text_str(t.name), std::string(to_string(t.dtype)), shape, t.file_offset,
                        t.nbytes, t.shard);
}

// `targets`: (tensor index, destination, begin, length) with length -1 for "to the end".
LoadReport read_into(const Checkpoint& ckpt, const py::list& targets) {
  std::vector<std::shared_ptr<BufferView>> views;
  std::vector<TensorTarget> plan;
  views.reserve(targets.size());
  plan.reserve(targets.size());
  const auto& tensors = ckpt.tensors();
  for (const py::handle& item : targets) {
    auto entry = item.cast<py::tuple>();
    TensorTarget target;
    target.tensor = static_cast<std::size_t>(*index_arg(entry[0], "tensor index"));
    if (target.tensor >= tensors.size()) throw py::index_error("ferry: no tensor at that index");
    const TensorInfo& t = tensors[target.tensor];
    target.begin = entry.size() > 2 ? *index_arg(entry[2], "begin") : 0;
    const bool to_end = entry.size() <= 3 || py::int_(entry[3]) < py::int_(0);
    const std::uint64_t want = to_end ? (target.begin <= t.nbytes ? t.nbytes - target.begin : 0)
                                      : *index_arg(entry[3], "length");
    if (!to_end) target.length = want;
    views.push_back(BufferView::of(entry[1], true));
    if (views.back()->nbytes() < want) {
      throw py::value_error("ferry: tensor '" + t.name + "' needs " + std::to_string(want) +
                            " bytes, its destination holds " +
                            std::to_string(views.back()->nbytes()));
    }
    target.buffer = views.back()->data();
    plan.push_back(target);
  }
  py::gil_scoped_release release;  // reacquired before `views` let go of the buffers
  return ckpt.read_into(plan);
}

void translate_checkpoint_errors(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const CheckpointError& e) {
    try {
      py::object cls = py::module_::import("ferry.checkpoint").attr("CheckpointError");
      py::object exc = cls(text_str(e.what()));
      exc.attr("filename") = path_str(e.file());
      exc.attr("tensor") = text_str(e.tensor());
      set_python_error(exc);
    } catch (const py::error_already_set& err) {
      PyErr_SetString(PyExc_ValueError,
                      (printable(e.what()) + " (and " + err.what() + ")").c_str());
    }
  }
}

}  // namespace

void bind_checkpoint(py::module_& m) {
  using py::arg;
  // Registered after bind_errors, so tried first; everything else falls through to it.
  py::register_exception_translator(translate_checkpoint_errors);

  py::class_<LoadReport>(m, "LoadReport",
                         "How a checkpoint load went: totals and per-shard routes.")
      .def_readonly("bytes", &LoadReport::bytes)
      .def_readonly("tensors", &LoadReport::tensors)
      .def_readonly("seconds", &LoadReport::seconds)
      .def_readonly("routes", &LoadReport::routes)
      .def("summary", &LoadReport::summary)
      .def("to_json", &LoadReport::to_json)
      .def("__repr__", &LoadReport::summary);

  m.def(
      "merge_load_reports",
      [](const std::vector<LoadReport>& parts, double seconds) {
        LoadReport all;
        for (const LoadReport& p : parts) {
          all.bytes += p.bytes;
          all.tensors += p.tensors;
          all.routes.insert(all.routes.end(), p.routes.begin(), p.routes.end());
        }
        all.seconds = seconds;
        return all;
      },
      arg("parts"), arg("seconds"),
      "One LoadReport for a load read in parts: bytes, tensors and routes of every part, and "
      "`seconds` for the whole.");

  py::class_<Checkpoint>(m, "Checkpoint")
      .def(py::init([](const py::object& path_object, bool direct,
                       const std::map<std::string, std::string>& settings) {
             const std::string path = path_arg(path_object);
             FileOptions options;
             options.direct = direct;
             for (const auto& [name, value] : settings) options.settings.set(name, value);
             py::gil_scoped_release release;
             return std::make_unique<Checkpoint>(path, std::move(options));
           }),
           arg("path"), arg("direct") = false,
           arg("settings") = std::map<std::string, std::string>{})
      .def_property_readonly("shards",
                             [](const Checkpoint& c) {
                               py::list out;
                               for (const std::string& s : c.shards()) out.append(path_str(s));
                               return out;
                             })
      .def_property_readonly("total_bytes", &Checkpoint::total_bytes)
      .def_property_readonly("index_metadata_json", &Checkpoint::index_metadata_json)
      .def(
          "tensors",
          [](const Checkpoint& c) {
            py::list out;
            for (const TensorInfo& t : c.tensors()) out.append(tensor_tuple(t));
            return out;
          },
          "(name, dtype, shape, file_offset, nbytes, shard) of every tensor, shard by shard in "
          "file order.")
      .def("metadata", &Checkpoint::metadata, arg("shard") = 0)
      .def("read_into", &read_into, arg("targets"),
           "Reads [(tensor_index, destination[, begin, length]), ...] with the GIL released.");
}

}  // namespace ferry::python
