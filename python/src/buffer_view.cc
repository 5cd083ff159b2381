#include "buffer_view.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace ferry::python {

namespace {

// DLPack's stable C ABI (dlpack.h, versions 0.x, the unversioned "dltensor" capsule), declared
// here so the extension needs no dlpack header.
struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; null means C-contiguous
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

std::string type_name(const py::handle& obj) {
  return py::str(py::type::handle_of(obj).attr("__qualname__")).cast<std::string>();
}

// Formats a shape or strides tuple like Python does. No iostreams here: seen on the GPU machine,
// an ostringstream in this extension crashed inside the PyTorch environment's interpreter
// (a locale facet from another libstdc++ already loaded in the process).
std::string describe(const std::vector<std::int64_t>& v) {
  std::string out = "(";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + (v.size() == 1 ? ",)" : ")");
}

// Bytes covered by a C-contiguous array, or nullopt when `strides` (in bytes; empty means
// contiguous) say it is not. Dimensions of extent 1 may carry any stride.
std::optional<std::size_t> contiguous_bytes(const std::vector<std::int64_t>& shape,
                                            const std::vector<std::int64_t>& strides,
                                            std::size_t itemsize) {
  std::size_t count = 1;
  for (std::int64_t extent : shape) count *= static_cast<std::size_t>(extent);
  if (count == 0 || strides.empty()) return count * itemsize;
  std::int64_t expected = static_cast<std::int64_t>(itemsize);
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return std::nullopt;
    expected *= shape[i];
  }
  return count * itemsize;
}

[[noreturn]] void not_contiguous(const py::handle& obj, const std::vector<std::int64_t>& shape,
                                 const std::vector<std::int64_t>& strides) {
  throw py::value_error("ferry: the target (" + type_name(obj) + ", shape " + describe(shape) +
                        ", byte strides " + describe(strides) +
                        ") is not C-contiguous; ferry moves one contiguous byte range. Pass a "
                        "contiguous array (e.g. ascontiguousarray(x) or x.contiguous()) or a "
                        "contiguous slice");
}

[[noreturn]] void read_only(const py::handle& obj) {
  throw py::value_error("ferry: the target (" + type_name(obj) +
                        ") is read-only; a read needs a writable target such as a bytearray, a "
                        "NumPy, CuPy or PyTorch array");
}

}  // namespace

BufferView::~BufferView() {
  if (has_view_) PyBuffer_Release(&view_);
}

namespace {

// A struct-module format with object pointers ('O'), outside field names (":name:").
bool holds_objects(const char* format) {
  if (format == nullptr) return false;
  bool in_name = false;
  for (const char* c = format; *c != 0; ++c) {
    if (*c == ':') in_name = !in_name;
    if (!in_name && *c == 'O') return true;
  }
  return false;
}

// Items that are Python object pointers: reading bytes into them corrupts the interpreter, and
// writing them out stores addresses, so they are refused before any I/O.
[[noreturn]] void not_plain_bytes(const py::handle& obj, const std::string& format) {
  throw py::type_error("ferry: a " + type_name(obj) + " of Python objects (format '" + format +
                       "') holds pointers, not data: ferry reads and writes arrays of plain "
                       "fixed-size items only");
}

}  // namespace

std::shared_ptr<BufferView> BufferView::of(const py::handle& obj, bool writable) {
  auto view = std::make_shared<BufferView>();
  view->fill(obj, writable);
  return view;
}

void BufferView::fill(const py::handle& obj, bool writable) {
  owner_ = py::reinterpret_borrow<py::object>(obj);
  // Types that export through the buffer protocol only, and whose instances cannot gain a
  // __cuda_array_interface__ attribute: skip the attribute lookups below (they cost as much as
  // a 4 KiB read from the page cache).
  PyTypeObject* type = Py_TYPE(obj.ptr());
  const bool plain = type == &PyByteArray_Type || type == &PyBytes_Type ||
                     type == &PyMemoryView_Type || std::strcmp(type->tp_name, "numpy.ndarray") == 0;
  if (!plain) {
    exported_otherwise(this, obj, writable);
  } else {
    through_buffer(this, obj, writable);
  }
}

void BufferView::exported_otherwise(BufferView* view, const py::handle& obj, bool writable) {
  // JAX arrays are immutable, whatever their exporters say.
  std::string module = py::str(py::type::handle_of(obj).attr("__module__")).cast<std::string>();
  if (writable && (module.rfind("jax", 0) == 0)) {
    throw py::value_error(
        "ferry: JAX arrays are immutable and cannot be read into; use "
        "ferry.load(path, dtype, like='jax') to get a new one");
  }

  py::object cai = py::getattr(obj, "__cuda_array_interface__", py::none());
  if (!cai.is_none()) {
    // The interface is the exporter's word: each field is checked, and a malformed one is named
    // (not a bare "stoul" or KeyError from deep inside).
    auto malformed = [&](const std::string& what) {
      return py::value_error("ferry: the __cuda_array_interface__ of the target (" +
                             type_name(obj) + ") " + what);
    };
    if (!py::isinstance<py::dict>(cai)) {
      throw py::type_error("ferry: the __cuda_array_interface__ of the target (" + type_name(obj) +
                           ") is a " + type_name(cai) + ", not a dict");
    }
    py::dict d = cai.cast<py::dict>();
    for (const char* key : {"typestr", "shape", "data"}) {
      if (!d.contains(key)) throw malformed(std::string("has no '") + key + "'");
    }
    if (d.contains("mask") && !d["mask"].is_none()) {
      throw py::value_error("ferry: masked CUDA arrays are not supported");
    }
    const py::object typestr_obj = d["typestr"];
    const std::string typestr =
        py::isinstance<py::str>(typestr_obj) ? typestr_obj.cast<std::string>() : std::string();
    const bool digits = typestr.size() > 2 && typestr.size() < 6 &&
                        typestr.find_first_not_of("0123456789", 2) == std::string::npos;
    if (!digits) {
      throw malformed("has typestr " + py::repr(typestr_obj).cast<std::string>() +
                      ", not a form like '<f4'");
    }
    if (typestr[1] == 'O') not_plain_bytes(obj, typestr);
    const std::size_t itemsize = std::stoul(typestr.substr(2));
    auto extents = [&](const char* field) {
      std::vector<std::int64_t> out;
      const py::object v = d[field];
      if (!py::isinstance<py::tuple>(v) && !py::isinstance<py::list>(v)) {
        throw malformed(std::string("has ") + field + " " + py::repr(v).cast<std::string>() +
                        ", not a tuple of ints");
      }
      for (py::handle e : v) {
        if (!py::isinstance<py::int_>(e)) {
          throw malformed(std::string("has ") + field + " " + py::repr(v).cast<std::string>() +
                          ", not a tuple of ints");
        }
        try {
          out.push_back(e.cast<std::int64_t>());
        } catch (const py::cast_error&) {
          throw malformed(std::string("has ") + field + " " + py::repr(v).cast<std::string>() +
                          " with a value past 64 bits");
        }
      }
      return out;
    };
    std::vector<std::int64_t> shape = extents("shape"), strides;
    std::size_t total = itemsize;
    for (std::int64_t extent : shape) {
      if (extent < 0) throw malformed("has a negative extent in shape " + describe(shape));
      if (__builtin_mul_overflow(total, static_cast<std::size_t>(extent), &total)) {
        throw malformed("has shape " + describe(shape) + ", more bytes than 64 bits count");
      }
    }
    if (d.contains("strides") && !d["strides"].is_none()) strides = extents("strides");
    const py::object data = d["data"];
    const bool pair = py::isinstance<py::tuple>(data) && py::len(data) == 2 &&
                      py::isinstance<py::int_>(data[py::int_(0)]) &&
                      py::isinstance<py::bool_>(data[py::int_(1)]);
    if (!pair) {
      throw malformed("has data " + py::repr(data).cast<std::string>() +
                      ", not (pointer, read_only)");
    }
    std::uintptr_t pointer = 0;
    try {
      pointer = data[py::int_(0)].cast<std::uintptr_t>();
    } catch (const py::cast_error&) {
      throw malformed("has data pointer " + py::repr(data[py::int_(0)]).cast<std::string>() +
                      ", not an address");
    }
    if (writable && data[py::int_(1)].cast<bool>()) read_only(obj);
    std::optional<std::size_t> bytes = contiguous_bytes(shape, strides, itemsize);
    if (!bytes) not_contiguous(obj, shape, strides);
    view->data_ = reinterpret_cast<void*>(pointer);
    view->nbytes_ = *bytes;
    view->exporter_ = "cuda_array_interface";
    return;
  }
  through_buffer(view, obj, writable);
}

void BufferView::through_buffer(BufferView* view, const py::handle& obj, bool writable) {
  if (PyObject_CheckBuffer(obj.ptr())) {
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view->view_, flags) != 0) {
      PyErr_Clear();
      if (writable && PyObject_GetBuffer(obj.ptr(), &view->view_, PyBUF_SIMPLE) == 0) {
        PyBuffer_Release(&view->view_);
        read_only(obj);
      }
      PyErr_Clear();
      throw py::value_error("ferry: could not get the memory of the target (" + type_name(obj) +
                            ") through the buffer protocol");
    }
    view->has_view_ = true;
    if (holds_objects(view->view_.format)) not_plain_bytes(obj, view->view_.format);
    if (!PyBuffer_IsContiguous(&view->view_, 'C')) {
      std::vector<std::int64_t> shape(view->view_.shape, view->view_.shape + view->view_.ndim);
      std::vector<std::int64_t> strides(view->view_.strides,
                                        view->view_.strides + view->view_.ndim);
      not_contiguous(obj, shape, strides);
    }
    view->data_ = view->view_.buf;
    view->nbytes_ = static_cast<std::size_t>(view->view_.len);
    view->exporter_ = "buffer";
    return;
  }

  if (py::hasattr(obj, "__dlpack__")) {
    py::object capsule = obj.attr("__dlpack__")();
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (managed == nullptr) throw py::error_already_set();
    const DLTensor& t = managed->dl_tensor;
    std::size_t itemsize = (t.dtype.bits * t.dtype.lanes + 7) / 8;
    std::vector<std::int64_t> shape(t.shape, t.shape + t.ndim), strides;
    if (t.strides != nullptr) {
      for (int i = 0; i < t.ndim; ++i) strides.push_back(t.strides[i] * itemsize);
    }
    std::optional<std::size_t> bytes = contiguous_bytes(shape, strides, itemsize);
    if (!bytes) not_contiguous(obj, shape, strides);
    // The capsule keeps the tensor alive; its destructor calls the deleter, since it is never
    // renamed to "used_dltensor".
    view->capsule_ = capsule;
    view->data_ = static_cast<char*>(t.data) + t.byte_offset;
    view->nbytes_ = *bytes;
    view->exporter_ = "dlpack";
    return;
  }

  throw py::type_error("ferry: a " + type_name(obj) +
                       " exports no memory; pass an object with __cuda_array_interface__, the "
                       "buffer protocol or __dlpack__ (CuPy, PyTorch, NumPy, JAX, bytearray, "
                       "memoryview)");
}

}  // namespace ferry::python
