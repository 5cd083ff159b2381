"""The three ways ferry finds an object's memory, tested on host memory: the CUDA Array Interface
and DLPack through stand-ins that expose only that interface over a NumPy array."""

import numpy as np
import pytest

import ferry
from ferry import _ferry


class CudaArrayStandIn:
    """Describes a NumPy array through __cuda_array_interface__ only (as CuPy would)."""

    def __init__(self, a, strides=None, readonly=False):
        self.a = a
        self.__cuda_array_interface__ = {
            "shape": a.shape, "typestr": a.dtype.str, "version": 3, "stream": None,
            "data": (a.ctypes.data, readonly), "strides": strides,
        }


class DLPackStandIn:
    """Exposes a NumPy array through __dlpack__ only (as a PyTorch CPU tensor would)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()


def test_cuda_array_interface_target(data_file):
    path, data = data_file
    a = np.zeros((4, 1000), np.float32)
    assert _ferry.buffer_info(CudaArrayStandIn(a)) == (a.ctypes.data, a.nbytes, "cuda_array_interface")
    with ferry.open(path) as f:
        assert f.read(CudaArrayStandIn(a), file_offset=9) == a.nbytes
        # Explicit C-contiguous strides are fine, others are not.
        assert f.read(CudaArrayStandIn(a, strides=a.strides)) == a.nbytes
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.read(CudaArrayStandIn(a, strides=(4, 16)))
        with pytest.raises(ValueError, match="read-only"):
            f.read(CudaArrayStandIn(a, readonly=True))
    assert a.tobytes() == data[:a.nbytes]


def test_dlpack_target(data_file):
    path, data = data_file
    a = np.zeros(5000, np.int16)
    assert _ferry.buffer_info(DLPackStandIn(a))[1:] == (a.nbytes, "dlpack")
    with ferry.open(path) as f:
        assert f.read(DLPackStandIn(a[1000:]), file_offset=3) == 4000 * 2
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.read(DLPackStandIn(a[::2]))
    assert a[1000:].tobytes() == data[3:3 + 8000] and not a[:1000].any()


def test_torch_cpu_tensor_through_dlpack(data_file):
    torch = pytest.importorskip("torch")
    path, data = data_file
    t = torch.zeros(3000, dtype=torch.uint8)
    with ferry.open(path) as f:
        assert f.read(t) == 3000
    assert t.numpy().tobytes() == data[:3000]


def test_read_only_exports_are_fine_to_write_from(tmp_path):
    a = np.arange(256, dtype=np.uint8)
    with ferry.open(tmp_path / "w.bin", "w") as f:
        assert f.write(CudaArrayStandIn(a, readonly=True)) == 256
        assert f.write(b"xyz", file_offset=256) == 3
    assert (tmp_path / "w.bin").read_bytes() == a.tobytes() + b"xyz"
