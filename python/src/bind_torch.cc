// _ferry.torch_save_file, _ferry.torch_open and _ferry.torch_read: ferry's torch.save files
// (ferry/torch_save.h) for python/ferry/torch.py, which walks the objects, pickles data.pkl and
// makes the tensors. Writes and reads run with the GIL released; the unpickled tree becomes Python
// values here, each class, object and persistent id made by the caller's `build`.
#include <pybind11/stl.h>

#include <map>
#include <unordered_map>
#include <vector>

#include "bindings.h"
#include "ferry/torch_save.h"

namespace ferry::python {

namespace {

using Kind = PickleValue::Kind;

// The tree as Python values; a value the pickle shares (its memo) becomes one Python object.
class Converter {
 public:
  explicit Converter(const py::function& build) : build_(build) {}

  py::object operator()(const PickleRef& v) {
    auto it = seen_.find(v.get());
    if (it != seen_.end()) return it->second;
    py::object out = convert(*v);
    seen_.emplace(v.get(), out);
    return out;
  }

 private:
  py::object convert(const PickleValue& v) {
    switch (v.kind) {
      case Kind::kNone:
        return py::none();
      case Kind::kBool:
        return py::bool_(v.boolean);
      case Kind::kInt:
        return py::int_(v.integer);
      case Kind::kFloat:
        return py::float_(v.real);
      case Kind::kStr:
        return text_str(v.text);
      case Kind::kBytes:
        return py::bytes(v.text);
      case Kind::kTuple:
      case Kind::kList: {
        py::list items;
        for (const PickleRef& i : v.items) items.append((*this)(i));
        if (v.kind == Kind::kList) return items;
        return py::tuple(items);
      }
      case Kind::kDict: {
        py::dict d;
        for (std::size_t i = 0; i + 1 < v.items.size(); i += 2) {
          d[(*this)(v.items[i])] = (*this)(v.items[i + 1]);
        }
        return d;
      }
      case Kind::kClass:
        return build_("class", v.text, py::none(), py::none(), py::none());
      case Kind::kObject: {
        py::object items = py::none();
        if (!v.items.empty()) {
          py::list pairs;
          for (std::size_t i = 0; i + 1 < v.items.size(); i += 2) {
            pairs.append(py::make_tuple((*this)(v.items[i]), (*this)(v.items[i + 1])));
          }
          items = std::move(pairs);
        }
        return build_("object", v.cls->text, (*this)(v.args),
                      v.state ? (*this)(v.state) : py::none(), items);
      }
      case Kind::kPersistentId:
        return build_("persistent", "", (*this)(v.items.at(0)), py::none(), py::none());
    }
    return py::none();
  }

  const py::function& build_;
  std::unordered_map<const PickleValue*, py::object> seen_;
};

}  // namespace

void bind_torch(py::module_& m) {
  using py::arg;
  m.def(
      "torch_save_file",
      [](const py::bytes& data_pkl, const py::list& storages, const py::object& path,
         std::uint64_t alignment, bool durable, const std::map<std::string, std::string>& settings,
         const py::object& progress) {
        const std::string pkl = data_pkl;
        const std::vector<TorchStorageSource> sources = named_memory<TorchStorageSource>(storages);
        const std::string file = path_arg(path);
        const SaveOptions o = save_options_arg(durable, settings, progress);
        py::gil_scoped_release release;
        return save_torch_file(pkl, sources, file, alignment, o);
      },
      arg("data_pkl"), arg("storages"), arg("path"), arg("alignment") = 4096, arg("durable") = true,
      arg("settings") = std::map<std::string, std::string>{}, arg("progress") = py::none(),
      "Writes the torch.save zip of `data_pkl` and [(key, ptr, nbytes), ...] to `path` "
      "(save_torch_file); a SaveReport. The memory must stay unchanged until it returns.");
  m.def(
      "torch_open",
      [](const py::object& path, const py::function& build) {
        const std::string file = path_arg(path);
        TorchFile f;
        {
          py::gil_scoped_release release;
          f = open_torch_file(file);
        }
        py::dict storages;
        for (const auto& [key, record] : f.storages) {
          storages[text_str(key)] = py::make_tuple(record.offset, record.nbytes);
        }
        build("storages", "", storages, py::none(), py::none());
        Converter convert(build);
        return py::make_tuple(convert(f.root), storages);
      },
      arg("path"), arg("build"),
      "(data.pkl's value, {key: (offset, nbytes)}) of the torch.save file `path` "
      "(open_torch_file). build('storages', '', that dict, None, None) comes first; then each "
      "class, object and persistent id in the value is "
      "build(kind, name, args, state, items): kind 'class' (name), 'object' (the class's name, "
      "args, BUILD's state, SETITEMS' (key, value) pairs or None), 'persistent' (args: the id).");
  m.def(
      "torch_read",
      [](const py::object& path, const py::list& ranges,
         const std::map<std::string, std::string>& settings) {
        const std::string file = path_arg(path);
        std::vector<ReadRange> plan;
        plan.reserve(ranges.size());
        for (const py::handle& row : ranges) {
          auto t = row.cast<py::tuple>();
          plan.push_back({t[0].cast<std::uint64_t>(), t[1].cast<std::size_t>(),
                          reinterpret_cast<void*>(t[2].cast<std::uintptr_t>())});
        }
        const FileOptions o = file_options_arg(settings);
        py::gil_scoped_release release;
        return read_torch_storages(file, plan, o);
      },
      arg("path"), arg("ranges"), arg("settings") = std::map<std::string, std::string>{},
      "Reads [(offset, nbytes, ptr), ...] of `path` into the memory at each ptr "
      "(read_torch_storages); a LoadReport. The memory must stay allocated until it returns.");
}

}  // namespace ferry::python
