// The memory behind a Python object, as one contiguous byte range ferry can read into or write
// from. Exporters, in the order tried: the CUDA Array Interface (CuPy, PyTorch CUDA tensors,
// Numba, JAX on GPU), the buffer protocol (NumPy, bytearray, memoryview, mmap), DLPack (PyTorch
// CPU tensors, JAX). A BufferView keeps the exporter alive and must be destroyed with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <memory>
#include <string>

namespace ferry::python {

namespace py = pybind11;

class BufferView {
 public:
  BufferView() = default;
  ~BufferView();
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  // "cuda_array_interface", "buffer" or "dlpack".
  const std::string& exporter() const { return exporter_; }

  // Throws TypeError for an object that exports no memory, ValueError for a non-contiguous one
  // or, when `writable`, a read-only one.
  static std::shared_ptr<BufferView> of(const py::handle& obj, bool writable);
  // The same, into an empty view the caller holds (on its stack, for a request that ends before
  // the call returns: no shared_ptr to make and free).
  void fill(const py::handle& obj, bool writable);

 private:
  static void exported_otherwise(BufferView* view, const py::handle& obj, bool writable);
  static void through_buffer(BufferView* view, const py::handle& obj, bool writable);

  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  std::string exporter_;
  py::object owner_;    // the object that owns the memory
  py::object capsule_;  // its DLPack capsule, when DLPack exported it
  Py_buffer view_{};
  bool has_view_ = false;
};

}  // namespace ferry::python
