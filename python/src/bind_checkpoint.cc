// _ferry.Checkpoint and _ferry.LoadReport: the safetensors loader for the Python package
// (ferry.safetensors, ferry.load_checkpoint). Python allocates every destination with its own
// framework: load() asks for each as Checkpoint::load needs it, read_into takes them all; both read
// with the GIL released. CheckpointError becomes ferry.CheckpointError (a ValueError).
#include <pybind11/stl.h>

#include <map>
#include <vector>

#include "bindings.h"
#include "buffer_view.h"
#include "ferry/checkpoint.h"
#include "ferry/checkpoint_writer.h"
#include "ferry/memory.h"
#include "ferry/printable.h"

namespace ferry::python {

namespace {

py::tuple tensor_tuple(const TensorInfo& t) {
  py::tuple shape(t.shape.size());
  for (std::size_t i = 0; i < t.shape.size(); ++i) shape[i] = t.shape[i];
  return py::make_tuple(text_str(t.name), std::string(to_string(t.dtype)), shape, t.file_offset,
                        t.nbytes, t.shard);
}

// The torch and NumPy dtypes that hold each safetensors dtype, by their attribute names ("": the
// framework has none), and whether a load's dtype= converts it (the floating-point kinds whose
// values ferry decodes: not the FNUZ float8 kinds, F6 or the packed F4), in the enumeration's
// order; safetensors_dtypes() refuses a table that misses a dtype, so a new one cannot reach
// Python without its row.
struct FrameworkDtypes {
  Dtype dtype;
  const char* torch;
  const char* numpy;
  bool convertible = false;
};
// clang-format off
constexpr FrameworkDtypes kFrameworkDtypes[] = {
    {Dtype::kBool, "bool", "bool"},                 {Dtype::kU8, "uint8", "uint8"},
    {Dtype::kI8, "int8", "int8"},                   {Dtype::kU16, "uint16", "uint16"},
    {Dtype::kI16, "int16", "int16"},                {Dtype::kF16, "float16", "float16", true},
    {Dtype::kBF16, "bfloat16", "", true},           {Dtype::kU32, "uint32", "uint32"},
    {Dtype::kI32, "int32", "int32"},                {Dtype::kF32, "float32", "float32", true},
    {Dtype::kU64, "uint64", "uint64"},              {Dtype::kI64, "int64", "int64"},
    {Dtype::kF64, "float64", "float64", true},      {Dtype::kC64, "complex64", "complex64"},
    {Dtype::kF8E4M3, "float8_e4m3fn", "", true},    {Dtype::kF8E5M2, "float8_e5m2", "", true},
    {Dtype::kF8E8M0, "float8_e8m0fnu", "", true},   {Dtype::kF6E2M3, "", ""},
    {Dtype::kF6E3M2, "", ""},                       {Dtype::kF4, "float4_e2m1fn_x2", ""},
    {Dtype::kF8E4M3FNUZ, "float8_e4m3fnuz", ""},    {Dtype::kF8E5M2FNUZ, "float8_e5m2fnuz", ""},
};
// clang-format on

struct DtypeRow {
  std::string name;
  unsigned bits;
  std::string torch;
  std::string numpy;
  bool convertible;
};

// `targets`: (tensor index, destination, begin, length[, at]) with length -1 for "to the end" and
// `at` the byte of the destination where they go (0 by default), or (tensor index, destination,
// [(begin, length), ...]): runs of the tensor laid back to back (a slice's). Consecutive targets
// into one destination object share its view: a slice's runs (ferry.iter_weights) are thousands of
// them, and viewing a CUDA tensor costs a __cuda_array_interface__ each.
std::vector<TensorTarget> plan_targets(const Checkpoint& ckpt, const py::list& targets,
                                       std::vector<std::shared_ptr<BufferView>>& views) {
  std::vector<TensorTarget> plan;
  views.reserve(targets.size());
  plan.reserve(targets.size());
  const auto& tensors = ckpt.tensors();
  py::handle last;  // the destination of `views.back()`, which keeps it alive
  for (const py::handle& item : targets) {
    auto entry = item.cast<py::tuple>();
    TensorTarget target;
    target.tensor = static_cast<std::size_t>(*index_arg(entry[0], "tensor index"));
    if (target.tensor >= tensors.size()) throw py::index_error("ferry: no tensor at that index");
    const TensorInfo& t = tensors[target.tensor];
    if (entry.size() == 3 && py::isinstance<py::list>(entry[2])) {
      // (index, destination, [(begin, length), ...]): the runs back to back from byte 0.
      auto runs = entry[2].cast<std::vector<std::pair<std::uint64_t, std::uint64_t>>>();
      views.push_back(BufferView::of(entry[1], true));
      last = entry[1];
      std::uint64_t at = 0;
      for (const auto& [begin, length] : runs) at += length;
      if (views.back()->nbytes() < at) {
        throw py::value_error("ferry: tensor '" + t.name + "' needs " + std::to_string(at) +
                              " bytes of its destination for its runs, which holds " +
                              std::to_string(views.back()->nbytes()));
      }
      at = 0;
      for (const auto& [begin, length] : runs) {
        target.begin = begin;
        target.length = length;
        target.buffer = static_cast<std::byte*>(views.back()->data()) + at;
        plan.push_back(target);
        at += length;
      }
      continue;
    }
    target.begin = entry.size() > 2 ? *index_arg(entry[2], "begin") : 0;
    const bool to_end = entry.size() <= 3 || py::int_(entry[3]) < py::int_(0);
    const std::uint64_t want = to_end ? (target.begin <= t.nbytes ? t.nbytes - target.begin : 0)
                                      : *index_arg(entry[3], "length");
    if (!to_end) target.length = want;
    const std::uint64_t at = entry.size() > 4 ? *index_arg(entry[4], "at") : 0;
    if (views.empty() || entry[1].ptr() != last.ptr()) {
      views.push_back(BufferView::of(entry[1], true));
      last = entry[1];
    }
    if (views.back()->nbytes() < want || views.back()->nbytes() - want < at) {
      throw py::value_error("ferry: tensor '" + t.name + "' needs " + std::to_string(want) +
                            " bytes at byte " + std::to_string(at) + " of its destination, which " +
                            "holds " + std::to_string(views.back()->nbytes()));
    }
    target.buffer = static_cast<std::byte*>(views.back()->data()) + at;
    plan.push_back(target);
  }
  return plan;
}

// _ferry.PendingRead: Checkpoint::start_read_into's reads and the views of their destinations,
// which it keeps until the reads are done. Waiting (in wait() or when destroyed unwaited) is
// done with the GIL released.
class PyPendingRead {
 public:
  PyPendingRead(const Checkpoint& ckpt, const py::list& targets) {
    std::vector<TensorTarget> plan = plan_targets(ckpt, targets, views_);
    py::gil_scoped_release release;
    pending_ = std::make_unique<PendingRead>(ckpt.start_read_into(plan));
  }
  ~PyPendingRead() {
    py::gil_scoped_release release;
    pending_.reset();  // waits for the reads, then `views_` let go with the GIL taken
  }
  LoadReport wait() {
    if (!pending_) throw py::value_error("ferry: this read was waited for already");
    py::gil_scoped_release release;
    std::unique_ptr<PendingRead> pending = std::move(pending_);
    return pending->wait();
  }

 private:
  std::vector<std::shared_ptr<BufferView>> views_;
  std::unique_ptr<PendingRead> pending_;
};

}  // namespace

ProgressOptions python_progress(const py::object& callback) {
  ProgressOptions progress;
  if (callback.is_none()) return progress;
  const py::object* fn = &callback;
  progress.callback = [fn](std::uint64_t done, std::uint64_t total) {
    py::gil_scoped_acquire gil;
    (*fn)(done, total);  // a Python exception: py::error_already_set, through C++, to Python
  };
  return progress;
}

FileOptions file_options_arg(const std::map<std::string, std::string>& settings, bool direct) {
  FileOptions o;
  o.direct = direct;
  for (const auto& [name, value] : settings) o.settings.set(name, value);
  return o;
}

SaveOptions save_options_arg(bool durable, const std::map<std::string, std::string>& settings,
                             const py::object& progress) {
  SaveOptions o;
  o.durable = durable;
  o.file = file_options_arg(settings);
  o.progress = python_progress(progress);
  return o;
}

Dtype dtype_arg(const std::string& tensor, const std::string& dtype) {
  const std::optional<Dtype> parsed = parse_dtype(dtype);
  if (!parsed) throw py::type_error("ferry: tensor '" + tensor + "': unknown dtype " + dtype);
  return *parsed;
}

namespace {

// Checkpoint::load into Python's memory: `allocate(nbytes)` returns an object exporting that many
// writable bytes (a torch tensor, a NumPy or CuPy array), called from this thread with the GIL
// taken as load() needs memory (`host`: pageable host memory, all before the first read; else a
// part at a time, overlapping the reads); the GIL is released otherwise. Into host memory, a
// mapped shard's FileMapping is handed to `wrap`, which returns the framework's byte array over
// it (keeping it alive); no `wrap`: every shard is read. `names`: the tensors (empty: all).
// Returns (report, the allocations then the wrapped mappings, (index, byte offset) of each tensor
// in them).
py::tuple load(const Checkpoint& ckpt, const py::function& allocate, std::vector<std::string> names,
               bool host, bool one_allocation, const py::object& progress, const py::object& wrap) {
  LoadOptions o;
  o.memory = host ? MemoryKind::kHostPageable : MemoryKind::kDevice;
  o.names = std::move(names);
  o.one_allocation = one_allocation;
  o.progress = python_progress(progress);
  if (wrap.is_none()) o.host_load = HostLoad::kRead;
  py::list allocations;
  std::vector<std::shared_ptr<BufferView>> views;  // destroyed with the GIL taken
  std::vector<const char*> starts;
  o.allocate = [&](std::uint64_t bytes) -> void* {
    py::gil_scoped_acquire gil;
    py::object raw = allocate(bytes);
    allocations.append(raw);
    starts.push_back(nullptr);
    if (bytes == 0) return nullptr;  // nothing is read into it
    views.push_back(BufferView::of(raw, true));
    if (views.back()->nbytes() < bytes) {
      throw py::value_error("ferry: an allocation of " + std::to_string(bytes) +
                            " B for a checkpoint load holds " +
                            std::to_string(views.back()->nbytes()));
    }
    starts.back() = static_cast<const char*>(views.back()->data());
    return views.back()->data();
  };
  LoadResult result;
  {
    py::gil_scoped_release release;
    result = ckpt.load(o);
  }
  const std::size_t first_mapping = allocations.size();
  for (const std::shared_ptr<const FileMapping>& m : result.mappings) {
    allocations.append(wrap(std::const_pointer_cast<FileMapping>(m)));
  }
  py::list places;
  for (const LoadedTensor& t : result.tensors) {
    const char* start =
        t.mapped ? static_cast<const char*>(result.mappings[t.memory]->data()) : starts[t.memory];
    const auto at = t.data == nullptr ? 0 : static_cast<const char*>(t.data) - start;
    places.append(py::make_tuple(t.mapped ? first_mapping + t.memory : t.memory, at));
  }
  return py::make_tuple(std::move(result.report), allocations, places);
}

// (name, dtype, shape, data pointer, nbytes[, storage[, storage bytes]]) rows from Python, as
// TensorSources; `storage` (0 when absent) tells views of one torch storage apart, `storage
// bytes` is that storage's size (TensorSource::storage, storage_bytes).
std::vector<TensorSource> sources(const py::list& rows) {
  std::vector<TensorSource> out;
  out.reserve(rows.size());
  for (const py::handle& item : rows) {
    auto row = item.cast<py::tuple>();
    TensorSource t;
    t.name = row[0].cast<std::string>();
    t.dtype = dtype_arg(t.name, row[1].cast<std::string>());
    t.shape = row[2].cast<std::vector<std::uint64_t>>();
    t.data = reinterpret_cast<const void*>(row[3].cast<std::uintptr_t>());
    t.nbytes = row[4].cast<std::uint64_t>();
    if (row.size() > 5) t.storage = row[5].cast<std::uint64_t>();
    if (row.size() > 6) t.storage_bytes = row[6].cast<std::uint64_t>();
    out.push_back(std::move(t));
  }
  return out;
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

  py::class_<HostRoute>(m, "HostRoute",
                        "How a host load served one shard: path 'mapped' (views of a private "
                        "mapping of the file) or 'read', and why.")
      .def_readonly("file", &HostRoute::file)
      .def_readonly("path", &HostRoute::path)
      .def_readonly("reason", &HostRoute::reason)
      .def_readonly("page_cache", &HostRoute::page_cache)
      .def_readonly("tensors", &HostRoute::tensors)
      .def_readonly("bytes", &HostRoute::bytes)
      .def_readonly("copied", &HostRoute::copied)
      .def("__repr__", &HostRoute::describe);

  py::class_<FileMapping, std::shared_ptr<FileMapping>>(
      m, "FileMapping", py::buffer_protocol(),
      "A private, copy-on-write mapping of a checkpoint shard: the memory of a mapped host "
      "load's tensors, unmapped when the last of them is gone.")
      .def_property_readonly("file", [](const FileMapping& f) { return path_str(f.file()); })
      .def_property_readonly("offset", &FileMapping::offset)
      .def_property_readonly("size", &FileMapping::size)
      .def_buffer([](FileMapping& f) {
        return py::buffer_info(f.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(f.size())}, {1}, false);
      });

  py::class_<LoadReport>(m, "LoadReport",
                         "How a checkpoint load went: totals and per-shard routes.")
      .def(py::init<>())
      .def_readonly("bytes", &LoadReport::bytes)
      .def_readonly("bytes_read", &LoadReport::bytes_read,
                    "What the tensors' reads took from storage (mapped bytes are not read).")
      .def_readonly("open_reads", &LoadReport::open_reads,
                    "The reads opening the checkpoint made (headers, DCP blob headers).")
      .def_readonly("open_bytes", &LoadReport::open_bytes, "Those reads' bytes.")
      .def_readonly("skipped", &LoadReport::skipped,
                    "A DCP folder's byte items (non-tensor values), listed, not loaded.")
      .def_readonly("tensors", &LoadReport::tensors)
      .def_readonly("seconds", &LoadReport::seconds)
      .def_readonly("allocate_seconds", &LoadReport::allocate_seconds)
      .def_readonly("routes", &LoadReport::routes)
      .def_readonly("gets", &LoadReport::gets, "A remote checkpoint's GETs (0 for local files).")
      .def_readonly("retries", &LoadReport::retries, "A remote checkpoint's retried attempts.")
      .def_readonly("connections", &LoadReport::connections,
                    "The connections a remote checkpoint's load opened.")
      .def_readonly("host_routes", &LoadReport::host_routes)
      .def("summary", &LoadReport::summary)
      .def("to_json", &LoadReport::to_json)
      .def("__repr__", &LoadReport::summary);

  py::class_<Buffer>(m, "HostMemory", py::buffer_protocol(),
                     "Pageable host memory of `nbytes`, uninitialised: from 2 MiB up it starts "
                     "on a 2 MiB boundary with transparent huge pages asked for its whole 2 MiB "
                     "pages, so that a read into it faults once per 2 MiB. Freed with the last "
                     "object that holds its buffer (torch.frombuffer's tensors do).")
      .def(py::init([](std::size_t nbytes) {
             return std::make_unique<Buffer>(MemoryKind::kHostPageable, nbytes);
           }),
           arg("nbytes"))
      .def_property_readonly("nbytes", &Buffer::size)
      .def_property_readonly(
          "address", [](const Buffer& b) { return reinterpret_cast<std::uintptr_t>(b.data()); })
      .def_buffer([](Buffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {1}, false);
      });

  py::class_<SaveReport>(m, "SaveReport", "How a checkpoint save went: files, bytes, routes.")
      .def_readonly("files", &SaveReport::files)
      .def_readonly("bytes", &SaveReport::bytes)
      .def_readonly("tensors", &SaveReport::tensors)
      .def_readonly("seconds", &SaveReport::seconds)
      .def_readonly("routes", &SaveReport::routes)
      .def_readonly("fsyncs", &SaveReport::fsyncs)
      .def("summary", &SaveReport::summary)
      .def("__repr__", &SaveReport::summary);

  py::class_<DtypeRow>(m, "SafetensorsDtype",
                       "One row of ferry's dtype table: the format's name, bits per element, and "
                       "the framework dtypes that hold it.")
      .def_readonly("name", &DtypeRow::name)
      .def_readonly("bits", &DtypeRow::bits)
      .def_readonly("torch", &DtypeRow::torch,
                    "torch's dtype attribute (\"\": none; F4 is torch's packed float4_e2m1fn_x2)")
      .def_readonly("numpy", &DtypeRow::numpy,
                    "NumPy's dtype (\"\": none; a load holds the bits as uint8/uint16)")
      .def_readonly("convertible", &DtypeRow::convertible,
                    "whether a load's dtype= converts it (a floating-point kind ferry decodes)")
      .def("__repr__", [](const DtypeRow& r) {
        return "SafetensorsDtype(" + r.name + ", bits=" + std::to_string(r.bits) + ", torch='" +
               r.torch + "', numpy='" + r.numpy + "')";
      });
  m.def(
      "safetensors_dtypes",
      [] {
        py::dict out;
        for (Dtype dtype : all_dtypes()) {
          const auto i = static_cast<std::size_t>(dtype);
          if (i >= std::size(kFrameworkDtypes) || kFrameworkDtypes[i].dtype != dtype) {
            throw std::logic_error("ferry: dtype " + std::string(to_string(dtype)) +
                                   " has no row in bind_checkpoint.cc's kFrameworkDtypes");
          }
          const FrameworkDtypes& f = kFrameworkDtypes[i];
          DtypeRow row{std::string(to_string(dtype)), dtype_bits(dtype), f.torch, f.numpy,
                       f.convertible};
          out[py::str(row.name)] = row;
        }
        return out;
      },
      "Every safetensors dtype by the format's name: ferry's one dtype table (C++), with the "
      "torch and NumPy dtypes that hold each.");
  m.def(
      "safetensors_layout",
      [](const py::list& rows, std::optional<std::map<std::string, std::string>> metadata) {
        const std::vector<TensorSource> tensors = sources(rows);
        SafetensorsLayout layout = safetensors_layout(tensors, metadata);
        return py::make_tuple(py::bytes(layout.header), layout.order);
      },
      arg("tensors"), arg("metadata"),
      "(header bytes, order of the tensors' bytes) of [(name, dtype, shape, ptr, nbytes), ...] "
      "as safetensors 0.8 lays them out.");
  m.def(
      "safetensors_parse",
      [](const py::bytes& data) {
        const std::string_view bytes = data;
        SafetensorsContents c = parse_safetensors(bytes);
        py::list rows;
        for (const TensorInfo& t : c.tensors) {
          rows.append(py::make_tuple(t.name, std::string(to_string(t.dtype)), t.shape,
                                     t.file_offset, t.nbytes));
        }
        return py::make_tuple(c.metadata, rows);
      },
      arg("data"),
      "(metadata, [(name, dtype, shape, offset, nbytes), ...]) of a whole safetensors file in "
      "`data`, its header validated as a file's is; offsets are into `data`, in byte order.");
  m.def(
      "save_file",
      [](const py::list& rows, const std::string& path,
         std::optional<std::map<std::string, std::string>> metadata, bool durable,
         const std::map<std::string, std::string>& settings, const py::object& progress) {
        const std::vector<TensorSource> tensors = sources(rows);
        SaveOptions o = save_options_arg(durable, settings, progress);
        o.metadata = std::move(metadata);
        py::gil_scoped_release release;
        return save_file(tensors, path, o);
      },
      arg("tensors"), arg("path"), arg("metadata"), arg("durable") = true,
      arg("settings") = std::map<std::string, std::string>{}, arg("progress") = py::none(),
      "Writes [(name, dtype, shape, ptr, nbytes), ...] to `path` with the GIL released; the "
      "memory must stay unchanged until it returns. `progress(done, total)`: called from this "
      "thread as the bytes are written (ProgressOptions).");
  m.def(
      "save_checkpoint",
      [](const py::list& rows, const std::string& directory,
         std::optional<std::map<std::string, std::string>> metadata, bool durable,
         std::uint64_t max_shard_size, const std::map<std::string, std::string>& settings,
         const py::object& progress) {
        const std::vector<TensorSource> tensors = sources(rows);
        SaveOptions o = save_options_arg(durable, settings, progress);
        o.metadata = std::move(metadata);
        o.max_shard_size = max_shard_size;
        py::gil_scoped_release release;
        return save_checkpoint(tensors, directory, o);
      },
      arg("tensors"), arg("directory"), arg("metadata"), arg("durable") = true,
      arg("max_shard_size") = 0, arg("settings") = std::map<std::string, std::string>{},
      arg("progress") = py::none(),
      "Writes shards and model.safetensors.index.json into `directory` with the GIL released. "
      "`progress(done, total)`: called from this thread as the bytes are written.");

  py::class_<PyPendingRead>(m, "PendingRead",
                            "Checkpoint.start_read_into's reads in flight; destroyed unwaited, it "
                            "waits for them.")
      .def("wait", &PyPendingRead::wait, "Waits for the reads (the GIL released): the LoadReport.");
  py::class_<Checkpoint>(m, "Checkpoint")
      .def(py::init([](const py::object& path_object, bool direct,
                       const std::map<std::string, std::string>& settings) {
             const std::string path = path_arg(path_object);
             FileOptions options = file_options_arg(settings, direct);
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
      .def(
          "start_read_into",
          [](const Checkpoint& c, const py::list& targets) {
            return std::make_unique<PyPendingRead>(c, targets);
          },
          arg("targets"), py::keep_alive<0, 1>(),
          "Submits the reads of [(tensor_index, destination[, begin, length[, at]]), ...] (into "
          "byte `at` of each destination) or of (tensor_index, destination, runs); wait() on the "
          "PendingRead returned waits, the GIL released, and gives the LoadReport.")
      .def("load", &load, arg("allocate"), arg("names"), arg("host"), arg("one_allocation"),
           arg("progress") = py::none(), arg("wrap") = py::none(),
           "Checkpoint::load (the loader of `ferry load`) into memory `allocate(nbytes)` gives, "
           "or into views of mappings `wrap(FileMapping)` makes arrays of: (report, allocations "
           "then wrapped mappings, [(index, offset) of each tensor in them, in file order]).");
}

}  // namespace ferry::python
