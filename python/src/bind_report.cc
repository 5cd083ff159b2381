// Route reports, process counters and the CUDA status, bound field by field: a field added to
// the C++ struct is one more line here (and appears in to_dict() at once, through to_json()).
// Enums are exposed by their stable to_string() names.
#include <pybind11/stl.h>

#include "bindings.h"
#include "ferry/memory.h"
#include "ferry/stats.h"
#include "ferry/warm_up.h"

namespace ferry::python {

namespace {

py::object json_loads(const std::string& text) {
  return py::module_::import("json").attr("loads")(text);
}

}  // namespace

void bind_report(py::module_& m) {
  py::class_<RouteReason>(m, "RouteReason")
      .def_property_readonly("code", [](const RouteReason& r) { return to_string(r.code); })
      .def_readonly("text", &RouteReason::text)
      .def("__repr__", [](const RouteReason& r) {
        return "RouteReason(" + to_string(r.code) + ": " + r.text + ")";
      });

  py::class_<CufileCounts>(m, "CufileCounts")
      .def_readonly("observable", &CufileCounts::observable)
      .def_readonly("why_not", &CufileCounts::why_not)
      .def_readonly("shared_window", &CufileCounts::shared_window)
      .def_readonly("nvfs", &CufileCounts::nvfs)
      .def_readonly("posix", &CufileCounts::posix)
      .def_readonly("p2p", &CufileCounts::p2p)
      .def_readonly("version", &CufileCounts::version)
      .def_readonly("compat_why", &CufileCounts::compat_why)
      .def_readonly("module_observable", &CufileCounts::module_observable)
      .def_readonly("module_why_not", &CufileCounts::module_why_not)
      .def_readonly("module_ops", &CufileCounts::module_ops);

  py::class_<PageCacheResidency>(m, "PageCacheResidency")
      .def_readonly("known", &PageCacheResidency::known)
      .def_readonly("why_not", &PageCacheResidency::why_not)
      .def_readonly("resident", &PageCacheResidency::resident)
      .def_readonly("bytes", &PageCacheResidency::bytes)
      .def_readonly("estimated", &PageCacheResidency::estimated)
      .def_readonly("method", &PageCacheResidency::method)
      .def_property_readonly("fraction", &PageCacheResidency::fraction)
      .def("__repr__",
           [](const PageCacheResidency& p) { return "<PageCacheResidency: " + describe(p) + ">"; });

  py::class_<RouteReport>(m, "RouteReport")
      .def_property_readonly("op", [](const RouteReport& r) { return to_string(r.op); })
      .def_readonly("file", &RouteReport::file)
      .def_property_readonly("memory", [](const RouteReport& r) { return to_string(r.memory); })
      .def_readonly("device", &RouteReport::device)
      .def_readonly("offset", &RouteReport::offset)
      .def_readonly("requested", &RouteReport::requested)
      .def_readonly("bytes", &RouteReport::bytes)
      .def_readonly("tasks", &RouteReport::tasks)
      .def_readonly("seconds", &RouteReport::seconds)
      .def_readonly("direct", &RouteReport::direct)
      .def_readonly("workers", &RouteReport::workers)
      .def_readonly("page_cache", &RouteReport::page_cache)
      .def_readonly("direct_tasks", &RouteReport::direct_tasks)
      .def_readonly("posix_tasks", &RouteReport::posix_tasks)
      .def_readonly("cufile_tasks", &RouteReport::cufile_tasks)
      .def_readonly("reasons", &RouteReport::reasons)
      .def_readonly("cufile", &RouteReport::cufile)
      .def_property_readonly("verdict", &RouteReport::verdict)
      .def("to_text", &RouteReport::to_text)
      .def("to_json", &RouteReport::to_json)
      .def("to_dict", [](const RouteReport& r) { return json_loads(r.to_json()); })
      .def("__str__", &RouteReport::to_text)
      .def("__repr__", [](const RouteReport& r) { return "<RouteReport: " + r.verdict() + ">"; });

  py::class_<Stats>(m, "Stats")
      .def_readonly("requests", &Stats::requests)
      .def_readonly("failed_requests", &Stats::failed_requests)
      .def_readonly("bytes_read", &Stats::bytes_read)
      .def_readonly("bytes_written", &Stats::bytes_written)
      .def_readonly("posix_tasks", &Stats::posix_tasks)
      .def_readonly("cufile_tasks", &Stats::cufile_tasks)
      .def_readonly("nvfs_pieces", &Stats::nvfs_pieces)
      .def_readonly("compat_pieces", &Stats::compat_pieces)
      .def_readonly("p2p_pieces", &Stats::p2p_pieces)
      .def_readonly("shared_windows", &Stats::shared_windows)
      .def_readonly("seconds", &Stats::seconds)
      .def_readonly("reasons", &Stats::reasons)
      .def("to_json", &Stats::to_json)
      .def("to_dict", [](const Stats& s) { return json_loads(s.to_json()); })
      .def("__repr__", [](const Stats& s) { return "Stats(" + s.to_json() + ")"; });
  m.def(
      "stats", [] { return stats(); }, "The process-wide counters.");
  m.def("reset_stats", &reset_stats);

  py::class_<GpuInfo>(m, "GpuInfo")
      .def_readonly("ordinal", &GpuInfo::ordinal)
      .def_readonly("name", &GpuInfo::name)
      .def_readonly("pci_bus_id", &GpuInfo::pci_bus_id)
      .def_readonly("total_memory", &GpuInfo::total_memory);
  py::class_<CudaStatus>(m, "CudaStatus")
      .def_readonly("available", &CudaStatus::available)
      .def_readonly("why_not", &CudaStatus::why_not)
      .def_readonly("driver_version", &CudaStatus::driver_version)
      .def_readonly("gpus", &CudaStatus::gpus);
  m.def(
      "cuda_status",
      [] {
        py::gil_scoped_release release;
        return cuda_status();
      },
      "Whether the CUDA driver loads, its version and the GPUs.");
  m.def(
      "warm_up",
      [](int device) {
        py::gil_scoped_release release;
        warm_up(device);
      },
      py::arg("device") = 0,
      "Pay the first GPU read's one-time costs now: the GPU's context, the worker threads and "
      "their pinned staging buffers. Optional; raises CudaError without a driver or GPU.");
}

}  // namespace ferry::python
