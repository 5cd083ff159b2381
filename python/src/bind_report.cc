// Route reports, process counters and the CUDA status, bound field by field through Record: a
// field added to the C++ struct is one more line here, and is then an attribute, a key of
// to_dict(), part of the pickled state and of ==. Enums are exposed by their stable to_string()
// names (and pickled as numbers).
#include <pybind11/stl.h>

#include <functional>
#include <memory>
#include <vector>

#include "bindings.h"
#include "ferry/memory.h"
#include "ferry/page_cache.h"
#include "ferry/remote.h"
#include "ferry/runtime.h"
#include "ferry/stats.h"
#include "ferry/warm_up.h"

namespace ferry::python {

namespace {

// A plain struct bound as a read-only Python record: attributes, to_dict(), pickling, ==.
template <typename T>
class Record {
 public:
  Record(py::module_& m, const char* name, const char* doc) : cls_(m, name, doc) {}

  template <typename M>
  Record& field(const char* name, M T::*member, const char* doc = nullptr) {
    if (doc != nullptr) {
      cls_.def_readonly(name, member, doc);
    } else {
      cls_.def_readonly(name, member);
    }
    fields_->push_back({name, [member](const T& t) { return py::cast(t.*member); },
                        [member](T& t, const py::handle& h) { t.*member = h.cast<M>(); }, nullptr});
    return *this;
  }
  // An enum member: its to_string() name as the attribute, its number in the pickled state.
  template <typename E>
  Record& name_of(const char* name, E T::*member, const char* doc = nullptr) {
    auto get = [member](const T& t) { return to_string(t.*member); };
    if (doc != nullptr) {
      cls_.def_property_readonly(name, get, doc);
    } else {
      cls_.def_property_readonly(name, get);
    }
    fields_->push_back(
        {name, [member](const T& t) { return py::cast(to_string(t.*member)); },
         [member](T& t, const py::handle& h) { t.*member = static_cast<E>(h.cast<int>()); },
         [member](const T& t) { return py::cast(static_cast<int>(t.*member)); }});
    return *this;
  }
  py::class_<T>& cls() { return cls_; }

  // Adds to_dict(), pickling and ==; call after the last field.
  py::class_<T>& done() {
    auto fields = fields_;
    cls_.def(
        "to_dict",
        [fields](const T& t) {
          py::dict d;
          for (const Field& f : *fields) d[f.name] = plain(f.get(t));
          return d;
        },
        "The attributes as a dict of plain values (nested records as dicts), keyed by "
        "attribute name.");
    cls_.def(py::pickle([fields](const T& t) { return state(*fields, t); },
                        [fields](const py::tuple& s) {
                          if (s.size() != fields->size()) {
                            throw py::value_error("ferry: a pickled record of another version");
                          }
                          T t;
                          for (std::size_t i = 0; i < fields->size(); ++i) {
                            (*fields)[i].set(t, s[i]);
                          }
                          return t;
                        }));
    cls_.def("__eq__", [fields](const T& a, const py::object& b) -> py::object {
      if (!py::isinstance<T>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
      return py::bool_(state(*fields, a).equal(state(*fields, b.cast<const T&>())));
    });
    cls_.attr("__hash__") = py::none();  // mutable-looking records are not keys
    return cls_;
  }

 private:
  struct Field {
    const char* name;
    std::function<py::object(const T&)> get;
    std::function<void(T&, const py::handle&)> set;
    std::function<py::object(const T&)> pickled;  // when it differs from get
  };

  static py::tuple state(const std::vector<Field>& fields, const T& t) {
    py::tuple s(fields.size());
    for (std::size_t i = 0; i < fields.size(); ++i) {
      s[i] = fields[i].pickled ? fields[i].pickled(t) : fields[i].get(t);
    }
    return s;
  }
  // Records inside a record (and lists of them) as dicts.
  static py::object plain(const py::object& value) {
    if (py::isinstance<py::list>(value)) {
      py::list out;
      for (const py::handle& item : value)
        out.append(plain(py::reinterpret_borrow<py::object>(item)));
      return out;
    }
    if (py::hasattr(value, "to_dict") && !py::isinstance<py::dict>(value)) {
      return value.attr("to_dict")();
    }
    return value;
  }

  py::class_<T> cls_;
  std::shared_ptr<std::vector<Field>> fields_ = std::make_shared<std::vector<Field>>();
};

}  // namespace

void bind_report(py::module_& m) {
  Record<RouteReason>(m, "RouteReason", "One reason of a route decision: a stable code and a text.")
      .name_of("code", &RouteReason::code, "Stable name, e.g. \"host_buffer\", \"engine\".")
      .field("text", &RouteReason::text)
      .done()
      .def("__repr__", [](const RouteReason& r) {
        return "RouteReason(" + to_string(r.code) + ": " + r.text + ")";
      });

  Record<CufileCounts>(m, "CufileCounts", "Layer 2: what cuFile did with the request's pieces.")
      .field("observable", &CufileCounts::observable)
      .field("why_not", &CufileCounts::why_not)
      .field("shared_window", &CufileCounts::shared_window)
      .field("gpu_entry", &CufileCounts::gpu_entry,
             "The GPU whose entry of cuFile's per-GPU counters held the pieces; -1: summed.")
      .field("counted_over", &CufileCounts::counted_over)
      .field("nvfs", &CufileCounts::nvfs)
      .field("posix", &CufileCounts::posix)
      .field("p2p", &CufileCounts::p2p)
      .field("version", &CufileCounts::version)
      .field("compat_why", &CufileCounts::compat_why)
      .field("unjudged", &CufileCounts::unjudged,
             "require=gds: why this request was not judged (a window shared with others).")
      .field("module_observable", &CufileCounts::module_observable)
      .field("module_why_not", &CufileCounts::module_why_not)
      .field("module_ops", &CufileCounts::module_ops)
      .done()
      .def("__repr__", [](const CufileCounts& c) {
        return "<CufileCounts: nvfs=" + std::to_string(c.nvfs) +
               " posix=" + std::to_string(c.posix) + " p2p=" + std::to_string(c.p2p) + ">";
      });

  Record<SourceCounts>(m, "SourceCounts",
                       "Below both layers for a remote object: the ranged GETs a request made.")
      .field("remote", &SourceCounts::remote)
      .field("url", &SourceCounts::url, "Without query or credentials.")
      .field("auth", &SourceCounts::auth)
      .field("gets", &SourceCounts::gets)
      .field("retries", &SourceCounts::retries)
      .field("connections", &SourceCounts::connections, "Connections opened (not kept alive).")
      .field("bytes", &SourceCounts::bytes)
      .field("retried", &SourceCounts::retried, "Why GETs were retried, e.g. \"HTTP 503 x2\".")
      .field("shared_window", &SourceCounts::shared_window)
      .field("range_ignored", &SourceCounts::range_ignored,
             "The server ignores Range: the bytes were streamed in order from whole-object GETs.")
      .field("discarded", &SourceCounts::discarded,
             "Bytes received before the ranges asked for and thrown away (range_ignored).")
      .done()
      .def("__repr__", [](const SourceCounts& c) {
        return "<SourceCounts: " + c.url + ": " + std::to_string(c.gets) + " GET(s), " +
               std::to_string(c.retries) + " retries>";
      });
  m.def(
      "remote_support",
      [] {
        RemoteSupport r = remote_support();
        return py::make_tuple(r.available, r.description);
      },
      "(available, description): whether http://, https:// and s3:// sources can be read "
      "here (libcurl loaded), and its version or why not.");

  m.def(
      "shown_path", [](const std::string& path) { return shown_path(path); }, py::arg("path"),
      "The path or URL as ferry's messages show it: a URL without its query and fragment "
      "(\"?...\" in their place) and without user:password@; a local path unchanged.");

  auto policy_dict = [](const RemotePolicy& p) {
    py::dict d;
    d["retries"] = p.retries ? py::cast(*p.retries) : py::none();
    d["stall_seconds"] = p.stall_seconds ? py::cast(*p.stall_seconds) : py::none();
    d["request_seconds"] = p.request_seconds ? py::cast(*p.request_seconds) : py::none();
    d["retry_statuses"] = p.retry_statuses ? py::cast(*p.retry_statuses) : py::none();
    return d;
  };
  m.def(
      "set_remote_policy",
      [](std::optional<int> retries, std::optional<long> stall_seconds,
         std::optional<std::vector<int>> retry_statuses, std::optional<long> request_seconds) {
        RemotePolicy p;
        p.retries = retries;
        p.stall_seconds = stall_seconds;
        p.retry_statuses = std::move(retry_statuses);
        p.request_seconds = request_seconds;
        set_remote_policy(p);
      },
      py::arg("retries") = py::none(), py::arg("stall_seconds") = py::none(),
      py::arg("retry_statuses") = py::none(), py::arg("request_seconds") = py::none(),
      "How remote objects opened from now on retry their GETs, process-wide; None leaves a "
      "field to its variable or default (ferry::set_remote_policy).");
  m.def(
      "remote_policy", [policy_dict] { return policy_dict(remote_policy()); },
      "The remote policy as set: {retries, stall_seconds, request_seconds, retry_statuses}, "
      "None where unset.");
  m.def(
      "effective_remote_policy", [policy_dict] { return policy_dict(effective_remote_policy()); },
      "What a remote object opened now gets: {retries, stall_seconds, request_seconds, "
      "retry_statuses}.");

  Record<PageCacheResidency>(m, "PageCacheResidency",
                             "How much of a read's range was in the page cache before it.")
      .field("known", &PageCacheResidency::known)
      .field("why_not", &PageCacheResidency::why_not)
      .field("resident", &PageCacheResidency::resident)
      .field("bytes", &PageCacheResidency::bytes)
      .field("estimated", &PageCacheResidency::estimated)
      .field("method", &PageCacheResidency::method)
      .done()
      .def_property_readonly("fraction", &PageCacheResidency::fraction)
      .def("__repr__",
           [](const PageCacheResidency& p) { return "<PageCacheResidency: " + describe(p) + ">"; });

  m.def(
      "page_cache_residency",
      [](py::object file, std::uint64_t offset, std::optional<std::uint64_t> size, bool exact) {
        const Residency how = exact ? Residency::kExact : Residency::kSampled;
        if (py::isinstance<py::int_>(file)) {
          const int fd = file.cast<int>();
          py::gil_scoped_release release;
          return page_cache_residency(fd, offset, size, how);
        }
        const std::string path = py::str(py::module_::import("os").attr("fspath")(file));
        py::gil_scoped_release release;
        return page_cache_residency(path, offset, size, how);
      },
      py::arg("file"), py::arg("offset") = 0, py::arg("size") = py::none(),
      py::arg("exact") = false,
      "How much of a file range sits in the page cache, measured without reading it (cachestat, "
      "else mincore): `file` a path or an open descriptor, `size` None for the rest of the file. "
      "exact=False samples ranges over 64 MiB (`estimated` then says so). A path that does not "
      "open raises IoError.");

  Record<RouteReport>(m, "RouteReport",
                      "Which path a request's bytes took, and why (docs/data-paths.md).")
      .name_of("op", &RouteReport::op, "\"read\" or \"write\".")
      .field("file", &RouteReport::file)
      .name_of("memory", &RouteReport::memory, "\"host_pageable\", \"device\"...")
      .field("device", &RouteReport::device, "The GPU ordinal, -1 for host memory.")
      .field("offset", &RouteReport::offset)
      .field("requested", &RouteReport::requested, "Bytes asked for.")
      .field("bytes", &RouteReport::bytes, "Bytes moved.")
      .field("tasks", &RouteReport::tasks)
      .field("ranges", &RouteReport::ranges,
             "A gathered read: the ranges asked for (0 for one-range requests).")
      .field("runs", &RouteReport::runs, "A gathered read: runs once adjacent ranges coalesced.")
      .field("seconds", &RouteReport::seconds)
      .field("direct", &RouteReport::direct, "Whether O_DIRECT was used.")
      .field("workers", &RouteReport::workers, "Threads that ran the request's tasks.")
      .field("page_cache", &RouteReport::page_cache)
      .field("direct_tasks", &RouteReport::direct_tasks)
      .field("posix_tasks", &RouteReport::posix_tasks)
      .field("cufile_tasks", &RouteReport::cufile_tasks)
      .field("reasons", &RouteReport::reasons)
      .field("cufile", &RouteReport::cufile)
      .field("source", &RouteReport::source, "A remote object's GETs (source.remote).")
      .done()
      .def_property_readonly("verdict", &RouteReport::verdict,
                             "One sentence: what happened and why.")
      .def("to_text", &RouteReport::to_text)
      .def("to_json", &RouteReport::to_json,
           "The stable JSON form (layer1/layer2 nesting, docs/data-paths.md).")
      .def("__str__", &RouteReport::to_text)
      .def("__repr__", [](const RouteReport& r) { return "<RouteReport: " + r.verdict() + ">"; });

  Record<Stats>(m, "Stats", "Process-wide counters since the start or the last reset.")
      .field("requests", &Stats::requests)
      .field("failed_requests", &Stats::failed_requests)
      .field("bytes_read", &Stats::bytes_read)
      .field("bytes_written", &Stats::bytes_written)
      .field("posix_tasks", &Stats::posix_tasks)
      .field("cufile_tasks", &Stats::cufile_tasks)
      .field("nvfs_pieces", &Stats::nvfs_pieces)
      .field("compat_pieces", &Stats::compat_pieces)
      .field("p2p_pieces", &Stats::p2p_pieces)
      .field("shared_windows", &Stats::shared_windows)
      .field("seconds", &Stats::seconds)
      .field("reasons", &Stats::reasons, "Requests per reason code.")
      .done()
      .def("to_json", &Stats::to_json)
      .def("__repr__", [](const Stats& s) { return "Stats(" + s.to_json() + ")"; });
  m.def(
      "stats", [] { return stats(); }, "The process-wide counters.");
  m.def("reset_stats", &reset_stats,
        "Sets every counter of stats() to zero (what the process publishes only grows).");

  Record<PublishStatus>(m, "PublishStatus",
                        "Whether this process publishes its counters for `ferry stats -p PID`.")
      .field("wanted", &PublishStatus::wanted)
      .field("published", &PublishStatus::published)
      .field("path", &PublishStatus::path, "The segment's file, when published.")
      .field("why_not", &PublishStatus::why_not, "Why it is not published, when it is not.")
      .done()
      .def("__bool__", [](const PublishStatus& s) { return s.published; })
      .def("__repr__", [](const PublishStatus& s) {
        return s.published ? "<PublishStatus: published at " + s.path + ">"
                           : "<PublishStatus: not published: " + s.why_not + ">";
      });
  m.def(
      "publish_stats",
      [](bool on) {
        py::gil_scoped_release release;
        return publish_stats(on);
      },
      py::arg("on"),
      "Publishes (True) or withdraws (False) this process's counters (docs/stats.md).");
  m.def("publish_status", &publish_status, "Whether this process publishes its counters.");
  m.def(
      "process_stats_json",
      [](int pid, const std::string& directory) {
        py::gil_scoped_release release;
        return read_process_stats(pid, directory).to_json();
      },
      py::arg("pid"), py::arg("directory") = "",
      "Another process's published counters, as the JSON of `ferry stats -p PID --json`.");

  Record<GpuInfo>(m, "GpuInfo", "One GPU the CUDA driver sees.")
      .field("ordinal", &GpuInfo::ordinal)
      .field("name", &GpuInfo::name)
      .field("pci_bus_id", &GpuInfo::pci_bus_id)
      .field("total_memory", &GpuInfo::total_memory)
      .done();
  Record<CudaStatus>(m, "CudaStatus", "Whether the CUDA driver loaded (why_not when not).")
      .field("available", &CudaStatus::available)
      .field("why_not", &CudaStatus::why_not)
      .field("driver_version", &CudaStatus::driver_version)
      .field("gpus", &CudaStatus::gpus)
      .done();
  m.def(
      "cuda_status",
      [] {
        py::gil_scoped_release release;
        return cuda_status();
      },
      "Whether the CUDA driver loads, its version and the GPUs.");
  m.def(
      "synchronize_stream",
      [](std::uintptr_t stream) {
        py::gil_scoped_release release;
        synchronize_stream(reinterpret_cast<void*>(stream));
      },
      py::arg("stream"),
      "Waits for the work queued on a CUstream (0: the legacy default stream), the GIL released.");
  m.def(
      "warm_up",
      [](int device) {
        py::gil_scoped_release release;
        warm_up(device);
      },
      py::arg("device") = 0,
      "Pay the first GPU read's one-time costs now: the GPU's context, the worker threads and "
      "their pinned staging buffers. Optional; raises CudaError without a driver or GPU.");
  m.def(
      "free_idle_staging",
      [] {
        py::gil_scoped_release release;
        return free_idle_staging();
      },
      "Frees the staging buffers no request is using (pinned memory for GPU reads and writes, "
      "aligned buffers for O_DIRECT) and returns their bytes; later requests make new ones.");
}

}  // namespace ferry::python
