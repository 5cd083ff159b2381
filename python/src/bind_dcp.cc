// _ferry.dcp_write_file, _ferry.DcpSaveLock and _ferry.dcp_commit: ferry's DCP writing core
// (ferry/dcp_writer.h) for python/ferry/dcp.py, which only gathers DCP's items and pickles its
// Metadata. Writes and the commit run with the GIL released; errors become ferry's Python errors.
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <vector>

#include "bindings.h"
#include "ferry/dcp_writer.h"

namespace ferry::python {

namespace {

SaveOptions dcp_options(bool durable, const std::map<std::string, std::string>& settings) {
  SaveOptions o;
  o.durable = durable;
  for (const auto& [name, value] : settings) o.file.settings.set(name, value);
  return o;
}

// (name, bytes) for a byte item; (name, dtype, shape, ptr, nbytes) for a contiguous tensor.
std::vector<DcpWriteItem> dcp_items(const py::list& rows) {
  std::vector<DcpWriteItem> out;
  out.reserve(rows.size());
  for (const py::handle& row_object : rows) {
    auto row = row_object.cast<py::tuple>();
    DcpWriteItem item;
    item.tensor.name = row[0].cast<std::string>();
    if (row.size() == 2) {
      item.is_bytes = true;
      item.bytes = row[1].cast<std::string>();
    } else {
      const std::string dtype = row[1].cast<std::string>();
      const std::optional<Dtype> parsed = parse_dtype(dtype);
      if (!parsed) {
        throw py::type_error("ferry: tensor '" + item.tensor.name + "': unknown dtype " + dtype);
      }
      item.tensor.dtype = *parsed;
      item.tensor.shape = row[2].cast<std::vector<std::uint64_t>>();
      item.tensor.data = reinterpret_cast<const void*>(row[3].cast<std::uintptr_t>());
      item.tensor.nbytes = row[4].cast<std::uint64_t>();
    }
    out.push_back(std::move(item));
  }
  return out;
}

}  // namespace

void bind_dcp(py::module_& m) {
  using py::arg;
  m.def(
      "dcp_write_file",
      [](const py::list& rows, const py::object& path, bool durable,
         const std::map<std::string, std::string>& settings) {
        const std::vector<DcpWriteItem> items = dcp_items(rows);
        const std::string file = path_arg(path);
        std::vector<DcpItemPlace> places;
        {
          py::gil_scoped_release release;
          places = write_dcp_file(items, file, dcp_options(durable, settings));
        }
        py::list out;
        for (const DcpItemPlace& p : places) out.append(py::make_tuple(p.offset, p.length));
        return out;
      },
      arg("items"), arg("path"), arg("durable") = true,
      arg("settings") = std::map<std::string, std::string>{},
      "Writes [(name, bytes) | (name, dtype, shape, ptr, nbytes), ...] into the .distcp file "
      "`path` (write_dcp_file); [(offset, length), ...] of each item. The memory must stay "
      "unchanged until it returns.");
  py::class_<DcpSaveLock>(m, "DcpSaveLock")
      .def(py::init([](const py::object& path, bool durable) {
             const std::string dir = path_arg(path);
             py::gil_scoped_release release;
             return std::make_unique<DcpSaveLock>(dir, durable);
           }),
           arg("path"), arg("durable") = true,
           "Makes the folder and takes its save lock, refusing a second writer; released when "
           "the object goes.");
  m.def(
      "dcp_commit",
      [](const py::object& path, const py::bytes& metadata, const std::vector<std::string>& files,
         bool durable, const std::map<std::string, std::string>& settings) {
        const std::string dir = path_arg(path);
        const std::string bytes = metadata;
        py::gil_scoped_release release;
        commit_dcp_metadata(dir, bytes, files, dcp_options(durable, settings));
      },
      arg("path"), arg("metadata"), arg("files"), arg("durable") = true,
      arg("settings") = std::map<std::string, std::string>{},
      "Commits `metadata` as .metadata of the folder `path` and removes the .distcp files "
      "`files` does not name (commit_dcp_metadata).");
}

}  // namespace ferry::python
