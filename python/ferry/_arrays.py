"""Whole-file helpers: ``read_into`` fills an existing array, ``load`` makes a new one in the
caller's framework (CuPy, PyTorch, NumPy; JAX through DLPack)."""

from __future__ import annotations

import importlib
import math
import os
import threading
from typing import Any, Optional, Sequence, Union

from . import _ferry
from ._errors import CudaError

PathLike = Union[str, "os.PathLike[str]"]

_local = threading.local()


def last_route() -> Optional[_ferry.RouteReport]:
    """The route of this thread's last ``read_into`` or ``load`` (None before the first)."""
    return getattr(_local, "route", None)


def read_into(path: PathLike, array: Any, file_offset: int = 0, **settings: Any) -> Any:
    """Fills `array` (any buffer ferry accepts) with the file's bytes from `file_offset` and
    returns it. Raises EOFError when the file is shorter than the array."""
    from . import open as _open

    _, nbytes, _ = _ferry.buffer_info(array, True)
    with _open(path, "r", **settings) as f:
        done = f.read(array, nbytes, file_offset)
        _local.route = f.last_route
    if done < nbytes:
        raise EOFError(f"{os.fspath(path)}: {done} bytes from offset {file_offset}, "
                       f"the array needs {nbytes}")
    return array


def _framework_of(like: Any) -> str:
    if isinstance(like, str):
        name = like
    elif hasattr(like, "__spec__") and hasattr(like, "__name__"):  # a module
        name = like.__name__
    else:
        name = type(like).__module__
    name = name.split(".")[0]
    return "jax" if name == "jaxlib" else name


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _gpu_framework() -> Optional[str]:
    """The first installed framework that sees a GPU: CuPy, then PyTorch."""
    cupy = _import("cupy")
    if cupy is not None:
        try:
            if cupy.cuda.runtime.getDeviceCount() > 0:
                return "cupy"
        except Exception:  # no driver, no device: CuPy raises its own CUDA errors
            pass
    torch = _import("torch")
    if torch is not None and torch.cuda.is_available():
        return "torch"
    return None


def _parse_device(device: str) -> Optional[int]:
    """None for "cpu", the ordinal for "cuda" / "cuda:N"."""
    if device == "cpu":
        return None
    if device == "cuda":
        return 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    raise ValueError(f"ferry.load: device must be 'cpu', 'cuda' or 'cuda:N', not {device!r}")


def _empty(framework: str, shape: tuple, dtype: Any, ordinal: Optional[int]) -> Any:
    import numpy

    if framework == "numpy":
        if ordinal is not None:
            raise ValueError("ferry.load: NumPy arrays live in host memory; use device='cpu'")
        return numpy.empty(shape, dtype)
    if framework == "cupy":
        import cupy

        if ordinal is None:
            raise ValueError("ferry.load: CuPy arrays live in GPU memory; use device='cuda:N'")
        with cupy.cuda.Device(ordinal):
            return cupy.empty(shape, dtype)
    if framework == "torch":
        import torch

        torch_dtype = torch.from_numpy(numpy.empty(0, dtype)).dtype
        where = "cpu" if ordinal is None else f"cuda:{ordinal}"
        raw = torch.empty(math.prod(shape) * dtype.itemsize, dtype=torch.uint8, device=where)
        return raw.view(torch_dtype).view(shape)
    raise ValueError(f"ferry.load: no allocator for {framework!r}; use like='cupy', 'torch', "
                     "'numpy' or 'jax'")


def load(path: PathLike, dtype: Any, shape: Optional[Sequence[int]] = None,
         device: Optional[str] = None, like: Any = None, file_offset: int = 0,
         **settings: Any) -> Any:
    """Reads a file into a new array.

    `like` picks the framework: a name ("cupy", "torch", "numpy", "jax"), a module or an array.
    Without it: CuPy or PyTorch when one sees a GPU, else NumPy on the host. `device` is "cpu" or
    "cuda:N"; by default the GPU 0 for GPU frameworks and "cpu" for NumPy. `shape` defaults to
    the whole file (from `file_offset`) as one dimension. JAX arrays are allocated by CuPy or
    PyTorch (NumPy on "cpu") and handed over through DLPack, without a copy.
    """
    import numpy

    dtype = numpy.dtype(dtype)
    if device is not None:
        _parse_device(device)
    framework = _framework_of(like) if like is not None else None
    if framework is None:
        framework = ("numpy" if device == "cpu" else _gpu_framework()) or (
            "numpy" if device is None else None)
        if framework is None:
            raise CudaError(f"ferry.load: device={device!r} but neither CuPy nor PyTorch sees a "
                            "GPU; pass device='cpu' for a NumPy array")
    if device is None:
        device = "cpu" if framework == "numpy" else "cuda:0"
    ordinal = _parse_device(device)
    if shape is None:
        size = os.stat(path).st_size - file_offset
        if size < 0 or size % dtype.itemsize:
            raise ValueError(f"ferry.load: {os.fspath(path)} has {size} bytes from offset "
                             f"{file_offset}, not a whole number of {dtype} items")
        shape = (size // dtype.itemsize,)
    shape = tuple(int(n) for n in shape)

    allocator = framework
    if framework == "jax":
        allocator = "numpy" if ordinal is None else (_gpu_framework() or "cupy")
    array = read_into(path, _empty(allocator, shape, dtype, ordinal), file_offset, **settings)
    if framework == "jax":
        import jax.numpy as jnp

        return jnp.from_dlpack(array)
    return array
