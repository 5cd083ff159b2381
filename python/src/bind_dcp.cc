// _ferry.dcp_write_file, _ferry.DcpSaveLock and _ferry.dcp_commit: ferry's DCP writing core
// (ferry/dcp_writer.h) for python/ferry/dcp.py, which only gathers DCP's items and pickles its
// Metadata; _ferry.dcp_read, its reading core (ferry/dcp_reader.h); _ferry.AsyncStagingPool
// (ferry/async_staging.h) for its Stager. Writes, reads, the commit and waits run with the GIL
// released; errors become ferry's Python errors.
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <vector>

#include "bindings.h"
#include "ferry/async_staging.h"
#include "ferry/dcp_reader.h"
#include "ferry/dcp_writer.h"

namespace ferry::python {

namespace {

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
      item.tensor.dtype = dtype_arg(item.tensor.name, row[1].cast<std::string>());
      item.tensor.shape = row[2].cast<std::vector<std::uint64_t>>();
      item.tensor.data = reinterpret_cast<const void*>(row[3].cast<std::uintptr_t>());
      item.tensor.nbytes = row[4].cast<std::uint64_t>();
    }
    out.push_back(std::move(item));
  }
  return out;
}

// One staged tensor's bytes, exported by the buffer protocol: the tensor torch.frombuffer makes
// of it keeps the stage (and so the pool's hold) alive.
struct StagedBytes {
  std::shared_ptr<AsyncStaging> staging;
  std::size_t index;
  std::size_t nbytes;
};

void bind_async_staging(py::module_& m) {
  using py::arg;
  py::class_<StagedBytes>(m, "StagedBytes", py::buffer_protocol())
      .def_buffer([](const StagedBytes& b) {
        return py::buffer_info(b.staging->place(b.index), 1, "B",
                               static_cast<py::ssize_t>(b.nbytes),
                               /*readonly=*/false);
      });
  py::class_<AsyncStaging, std::shared_ptr<AsyncStaging>>(m, "AsyncStaging")
      .def(
          "wait",
          [](const AsyncStaging& s) {
            py::gil_scoped_release release;
            s.wait();
          },
          "Blocks until every copy has landed; raises naming the first tensor that failed.")
      .def("done", &AsyncStaging::done)
      .def(
          "bytes",
          [](const std::shared_ptr<AsyncStaging>& s, std::size_t i, std::size_t nbytes) {
            if (i >= s->size()) throw py::index_error("staged item " + std::to_string(i));
            return StagedBytes{s, i, nbytes};
          },
          arg("index"), arg("nbytes"), "Item `index`'s staged bytes (a buffer).");
  py::class_<AsyncStagingPool>(m, "AsyncStagingPool")
      .def(py::init<>())
      .def(
          "stage",
          [](AsyncStagingPool& pool, const py::list& rows, const py::list& after, double wait_s) {
            const std::vector<StageItem> items = named_memory<StageItem>(rows);
            std::vector<StageAfter> streams;
            for (const py::handle& a : after) {
              auto t = a.cast<py::tuple>();
              streams.push_back({t[0].cast<int>(), t[1].cast<std::uintptr_t>()});
            }
            py::gil_scoped_release release;
            return pool.stage(items, streams,
                              std::chrono::milliseconds(static_cast<std::int64_t>(wait_s * 1000)));
          },
          arg("items"), arg("after") = py::list(), arg("wait_s") = 0.0,
          "Stages [(name, ptr, nbytes), ...] (AsyncStagingPool::stage), the GPU copies after "
          "the work on [(device, stream handle), ...]; waits up to `wait_s` for the previous "
          "stage's tensors to be released.")
      .def(
          "close",
          [](AsyncStagingPool& pool) {
            py::gil_scoped_release release;
            pool.close();
          },
          "Frees the pinned memory; raises while staged tensors are still referenced.")
      .def("report", [](const AsyncStagingPool& pool) {
        const AsyncStagingReport r = pool.report();
        py::dict d;
        d["pinned"] = r.pinned;
        d["pinned_bytes"] = r.pinned_bytes;
        d["chunks"] = r.chunks;
        d["allocations"] = r.allocations;
        d["growths"] = r.growths;
        d["stages"] = r.stages;
        d["last_bytes"] = r.last_bytes;
        d["last_gpu_bytes"] = r.last_gpu_bytes;
        d["last_batches"] = r.last_batches;
        d["last_queue_seconds"] = r.last_queue_seconds;
        d["last_staged_seconds"] = r.last_staged_seconds;
        return d;
      });
}

}  // namespace

void bind_dcp(py::module_& m) {
  using py::arg;
  m.def(
      "dcp_write_file",
      [](const py::list& rows, const py::object& path, bool durable,
         const std::map<std::string, std::string>& settings, const py::object& progress) {
        const std::vector<DcpWriteItem> items = dcp_items(rows);
        const std::string file = path_arg(path);
        const SaveOptions o = save_options_arg(durable, settings, progress);
        std::vector<DcpItemPlace> places;
        SaveReport report;
        {
          py::gil_scoped_release release;
          places = write_dcp_file(items, file, o, &report);
        }
        py::list out;
        for (const DcpItemPlace& p : places) out.append(py::make_tuple(p.offset, p.length));
        return py::make_tuple(out, report);
      },
      arg("items"), arg("path"), arg("durable") = true,
      arg("settings") = std::map<std::string, std::string>{}, arg("progress") = py::none(),
      "Writes [(name, bytes) | (name, dtype, shape, ptr, nbytes), ...] into the .distcp file "
      "`path` (write_dcp_file); ([(offset, length), ...] of each item, its SaveReport). The "
      "memory must stay unchanged until it returns.");
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
        SaveReport report;
        py::gil_scoped_release release;
        commit_dcp_metadata(dir, bytes, files, save_options_arg(durable, settings), &report);
        return report;
      },
      arg("path"), arg("metadata"), arg("files"), arg("durable") = true,
      arg("settings") = std::map<std::string, std::string>{},
      "Commits `metadata` as .metadata of the folder `path` and removes the .distcp files "
      "`files` does not name (commit_dcp_metadata); the commit's SaveReport.");
  m.def(
      "dcp_read",
      [](const py::object& path, const py::list& rows,
         const std::map<std::string, std::string>& settings) {
        std::vector<DcpReadItem> items;
        items.reserve(rows.size());
        for (const py::handle& row_object : rows) {
          auto row = row_object.cast<py::tuple>();
          DcpReadItem item;
          item.name = row[0].cast<std::string>();
          item.relative_path = row[1].cast<std::string>();
          item.blob_offset = row[2].cast<std::uint64_t>();
          item.blob_length = row[3].cast<std::uint64_t>();
          item.dtype = dtype_arg(item.name, row[4].cast<std::string>());
          item.offsets = row[5].cast<std::vector<std::uint64_t>>();
          item.lengths = row[6].cast<std::vector<std::uint64_t>>();
          item.buffer = reinterpret_cast<void*>(row[7].cast<std::uintptr_t>());
          items.push_back(std::move(item));
        }
        const std::string dir = path_arg(path);
        const FileOptions o = file_options_arg(settings);
        py::gil_scoped_release release;
        return read_dcp_items(dir, items, o);
      },
      arg("path"), arg("items"), arg("settings") = std::map<std::string, std::string>{},
      "Reads [(name, relative_path, blob_offset, blob_length, dtype, offsets, lengths, ptr), "
      "...] of the DCP folder `path`: each region of a saved chunk into the contiguous memory at "
      "ptr (read_dcp_items); a LoadReport. The memory must stay allocated until it returns.");
  bind_async_staging(m);
}

}  // namespace ferry::python
