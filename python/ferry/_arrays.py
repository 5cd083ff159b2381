"""Whole-file helpers: ``read_into`` fills an existing array; ``fromfile`` makes a new one from
a file's raw bytes, ``load`` from a ``.npy`` file (by its header) or raw bytes, in the caller's
framework (CuPy, PyTorch, NumPy; JAX through DLPack)."""

from __future__ import annotations

import builtins
import difflib
import errno
import importlib
import math
import operator
import os
import threading
import sys
from typing import Any, NamedTuple, Optional, Union

from . import _ferry, _streams
from ._errors import CudaError, _io_class

PathLike = Union[str, "os.PathLike[str]"]

_local = threading.local()


def last_route() -> Optional[_ferry.RouteReport]:
    """The route of this thread's last ``read_into`` or ``load`` (None before the first)."""
    return getattr(_local, "route", None)


def _nonnegative(value: Any, name: str, who: str) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{who}: {name} must be an int, not {type(value).__name__}") from None
    if n < 0:
        raise ValueError(f"{who}: {name} must be >= 0, not {n}")
    return n


# The keywords fromfile and load take besides settings; NumPy's names are mapped below.
_KEYWORDS = ("dtype", "shape", "device", "like", "file_offset", "offset", "count")


def _check_keywords(who: str, settings: dict[str, Any]) -> None:
    """Refuses a keyword that is neither a parameter nor a setting, naming the nearest one:
    a TypeError, as Python's own for a misspelt keyword."""
    from ._settings import ALIASES

    names = list(_ferry.get_settings()) + list(ALIASES)
    for key in settings:
        if key in names:
            continue
        near = difflib.get_close_matches(key, list(_KEYWORDS) + names, n=1)
        hint = f"; did you mean {near[0]}?" if near else ""
        raise TypeError(f"{who}() got an unexpected keyword argument '{key}'{hint}")


def _numpy_keywords(who: str, file_offset: int, settings: dict[str, Any]) -> tuple[int, int]:
    """NumPy's names for what ferry calls otherwise: `offset` is file_offset, `count` the number
    of items (-1: all). `sep` (text files) and `mmap_mode` (mapping) are refused: ferry reads
    binary files into memory. Returns (file_offset, count); removes them from `settings`."""
    if "offset" in settings:
        offset = settings.pop("offset")
        if file_offset:
            raise TypeError(f"{who}: offset (NumPy's name) and file_offset are the same; give one")
        file_offset = offset
    count = settings.pop("count", -1)
    if not isinstance(count, int) or isinstance(count, bool) or count < -1:
        raise ValueError(f"{who}: count must be -1 (the whole file) or a number of items >= 0, "
                         f"not {count!r}")
    if settings.get("sep", "") != "":
        raise ValueError(f"{who}: sep={settings['sep']!r} reads a text file in NumPy; ferry reads "
                         "binary files only (use numpy.fromfile or numpy.loadtxt for text)")
    settings.pop("sep", None)
    if settings.get("mmap_mode") is not None:
        raise ValueError(f"{who}: mmap_mode={settings['mmap_mode']!r} maps the file in NumPy; "
                         "ferry reads it into memory (use numpy.load(..., mmap_mode=...) to map)")
    settings.pop("mmap_mode", None)
    _check_keywords(who, settings)
    return file_offset, count


class _Items(NamedTuple):
    """The item type asked for, in NumPy's and PyTorch's terms where each has it."""
    numpy: Any  # a numpy.dtype, or None (bfloat16 has none)
    torch: Any  # a torch.dtype, or None where it was not given as one
    itemsize: int
    name: str


def _registered(dtype: Any) -> bool:
    """A dtype registered from outside NumPy (numpy.dtype.isbuiltin 2, NumPy's
    PyTypeNum_ISUSERDEF): ml_dtypes' bfloat16 and float8 kinds, which ml_dtypes also names in
    numpy.sctypeDict, so that numpy.dtype("bfloat16") works wherever ml_dtypes was imported
    (JAX, TensorFlow and ONNX import it)."""
    return bool(dtype.isbuiltin == 2)


def _numpys_own(numpy: Any, name: str) -> bool:
    """Whether NumPy itself has a dtype of this name: not only through one registered from
    outside it (ml_dtypes), which a process may or may not have imported."""
    try:
        return not _registered(numpy.dtype(name))
    except TypeError:
        return False


def _items_of(who: str, dtype: Any) -> _Items:
    """A NumPy dtype (or anything numpy.dtype takes: "float32", "<f4", numpy.float32), a torch
    dtype (torch.bfloat16) or its name ("bfloat16"). A name is NumPy's where NumPy has it
    itself, else PyTorch's where PyTorch has it: "bfloat16" is torch.bfloat16 whether or not
    ml_dtypes registered a NumPy dtype of that name (NumPy's is used only without PyTorch)."""
    import numpy

    torch = sys.modules.get("torch")
    if torch is None and isinstance(dtype, str):
        torch = _import("torch") if dtype in ("bfloat16",) else None
    if isinstance(dtype, str) and torch is not None:
        named = getattr(torch, dtype, None)
        if isinstance(named, torch.dtype) and not _numpys_own(numpy, dtype):
            dtype = named  # a name NumPy knows at most through ml_dtypes
    if torch is not None and isinstance(dtype, torch.dtype):
        probe = torch.empty(0, dtype=dtype)
        try:
            as_numpy = numpy.dtype(probe.numpy().dtype)
        except (TypeError, RuntimeError):
            as_numpy = None  # bfloat16
        return _Items(as_numpy, dtype, probe.element_size(), str(dtype).replace("torch.", ""))
    try:
        as_numpy = numpy.dtype(dtype)
    except TypeError:
        raise TypeError(f"{who}: dtype {dtype!r} is neither a NumPy nor a PyTorch dtype") from None
    if as_numpy.hasobject:
        raise TypeError(f"{who}: dtype {as_numpy} holds Python objects, which files cannot")
    return _Items(as_numpy, None, as_numpy.itemsize, str(as_numpy))


def _as_target(array: Any) -> Any:
    """What the extension reads into for `array`: the array itself, or, for a NumPy array whose
    dtype has no buffer-protocol format (ml_dtypes' bfloat16 and float8 kinds and other dtypes
    registered from outside NumPy, datetime64, timedelta64), a uint8 view of its bytes. NumPy
    refuses such an array's buffer when a format is asked for, and gives it without one, which
    the extension would report as a read-only target."""
    numpy = sys.modules.get("numpy")
    if numpy is None or not isinstance(array, numpy.ndarray):
        return array
    dtype = array.dtype
    if not (_registered(dtype) or dtype.kind in "mM") or dtype.hasobject:
        return array  # a format NumPy exports, or objects the extension refuses
    if not array.flags.writeable:
        return array  # the extension's refusal of a read-only target is the right one
    if not array.flags.c_contiguous:
        raise ValueError(f"ferry: the target (ndarray of {dtype}, shape {array.shape}, byte "
                         f"strides {array.strides}) is not C-contiguous; ferry moves one "
                         "contiguous byte range. Pass a contiguous array (e.g. "
                         "ascontiguousarray(x)) or a contiguous slice")
    return array.reshape(-1).view(numpy.uint8)  # a view: contiguous, so no copy


def _fill(f: Any, array: Any, file_offset: int, path: PathLike) -> Any:
    """Reads the whole of `array` from the open File `f`; EOFError when the file is shorter."""
    target = _as_target(array)
    _, nbytes, _ = _ferry.buffer_info(target, True)
    done = f.read(target, nbytes, file_offset)
    _local.route = f.last_route
    if done < nbytes:
        raise EOFError(f"{_shown(path)}: {done} bytes from offset {file_offset}, "
                       f"the array needs {nbytes}")
    return array


def read_into(path: PathLike, array: Any, file_offset: int = 0, **settings: Any) -> Any:
    """Fills `array` (any buffer ferry accepts) with the file's raw bytes from `file_offset` and
    returns it. Raises EOFError when the file is shorter than the array."""
    from . import open as _open

    file_offset = _nonnegative(file_offset, "file_offset", "ferry.read_into")
    _check_keywords("ferry.read_into", settings)
    _ferry.buffer_info(_as_target(array), True)  # a bad buffer is refused before the open
    with _open(path, "r", **settings) as f:
        return _fill(f, array, file_offset, path)


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


def _torch_sees_gpu() -> bool:
    torch = _import("torch")
    return torch is not None and bool(torch.cuda.is_available())


def parse_device(device: Any, who: str) -> Optional[int]:
    """ferry's one reading of a device: None for "cpu", the GPU ordinal for "cuda" (GPU 0),
    "cuda:N" or an int N >= 0. TypeError for another type (bool too), ValueError for another
    value, each naming `who`. (checkpoint._gpu_ordinal reads str() of a torch.device with it.)"""
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"{who}: device must be >= 0, not {device}")
        return device
    if not isinstance(device, str):
        raise TypeError(f"{who}: device must be 'cpu', 'cuda', 'cuda:N' or an int, not "
                        f"{type(device).__name__}")
    if device == "cpu":
        return None
    if device == "cuda":
        return 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    raise ValueError(f"{who}: device must be 'cpu', 'cuda', 'cuda:N' or an int, not {device!r}")


def _shape_of(shape: Any) -> tuple[int, ...]:
    if isinstance(shape, int) or hasattr(shape, "__index__"):
        shape = (shape,)
    try:
        dims = tuple(operator.index(n) for n in shape)
    except TypeError:
        raise TypeError(f"ferry.load: shape must be an int or a sequence of ints, not {shape!r}") \
            from None
    if any(n < 0 for n in dims):
        raise ValueError(f"ferry.load: shape {dims} has a negative dimension")
    return dims


def _npy_header(path: PathLike) -> Optional[tuple[tuple[int, ...], Any, int]]:
    """(shape, dtype, data offset) of a .npy file, None for any other file."""
    import numpy
    from numpy.lib import format as npy

    with builtins.open(path, "rb") as fh:
        if fh.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
            return None
        fh.seek(0)
        version = npy.read_magic(fh)  # type: ignore[no-untyped-call]
        read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, fortran_order, dtype = read_header(fh)  # type: ignore[no-untyped-call]
        if fortran_order:
            raise ValueError(f"ferry.load: {_shown(path)} is a Fortran-order .npy file; ferry "
                             "reads C-order ones only (numpy.load reads it)")
        return tuple(shape), numpy.dtype(dtype), fh.tell()


_NPY_MAGIC = b"\x93NUMPY"


def _is_zip(path: PathLike) -> bool:
    with builtins.open(path, "rb") as fh:
        return fh.read(4) == b"PK\x03\x04"


def _empty(framework: str, shape: tuple[int, ...], items: _Items, ordinal: Optional[int]) -> Any:
    import numpy

    if framework != "torch" and items.numpy is None:
        raise TypeError(f"ferry.load: dtype {items.name} exists in PyTorch only: pass like='torch'")
    dtype = items.numpy

    if framework == "numpy":
        if ordinal is not None:
            raise ValueError("ferry.load: NumPy arrays live in host memory; use device='cpu'")
        return numpy.empty(shape, dtype)
    if framework == "cupy":
        import cupy  # type: ignore[import]

        if ordinal is None:
            raise ValueError("ferry.load: CuPy arrays live in GPU memory; use device='cuda:N'")
        with cupy.cuda.Device(ordinal):
            return cupy.empty(shape, dtype)
    if framework == "torch":
        import torch  # type: ignore[import]

        torch_dtype = items.torch or torch.from_numpy(numpy.empty(0, items.numpy)).dtype
        where = "cpu" if ordinal is None else f"cuda:{ordinal}"
        raw = torch.empty(math.prod(shape) * items.itemsize, dtype=torch.uint8, device=where)
        return raw.view(torch_dtype).view(shape)
    raise ValueError(f"ferry.load: no allocator for {framework!r}; use like='cupy', 'torch', "
                     "'numpy' or 'jax'")


def fromfile(path: PathLike, dtype: Any, shape: Any = None, device: Any = None,
             like: Any = None, file_offset: int = 0, **settings: Any) -> Any:
    """Reads a file's raw bytes into a new array, like ``numpy.fromfile``: no header is parsed.

    `dtype` is the type of the items: a NumPy dtype, a PyTorch one (``torch.bfloat16``, which
    makes a PyTorch tensor) or a name ("float32", "bfloat16"). `shape` (an int or a sequence of
    ints) defaults to the whole file from `file_offset` as one dimension. NumPy's names work too:
    ``offset=`` is `file_offset`, ``count=`` a number of items (one dimension); ``sep`` (text)
    is refused. `like` picks the framework: a name ("cupy", "torch", "numpy", "jax"), a module
    or an array. Without it: CuPy or PyTorch when one sees a GPU, else NumPy on the host.
    `device` is "cpu", "cuda", "cuda:N" or N; by default the GPU 0 where the framework sees a
    GPU, else "cpu" (NumPy, PyTorch without CUDA, JAX when no GPU framework sees a GPU). JAX
    arrays are allocated by CuPy or PyTorch (NumPy on "cpu") and handed over through DLPack,
    without a copy.
    """
    file_offset, count = _numpy_keywords("ferry.fromfile", file_offset, settings)
    shape = _count_as_shape("ferry.fromfile", shape, count)
    return _load("ferry.fromfile", path, dtype, shape, device, like, file_offset, settings)


def _count_as_shape(who: str, shape: Any, count: int) -> Any:
    if count == -1:
        return shape
    if shape is not None:
        raise TypeError(f"{who}: count (NumPy's name) and shape both give the size; give one")
    return (count,)


def _shown(path: PathLike) -> str:
    """`path` as messages show it: a URL without its credentials or query (ferry::shown_path)."""
    return _ferry.shown_path(os.fsdecode(path))


def _missing(who: str, path: PathLike) -> None:
    """FileNotFoundError, as numpy.load and open() raise, when `path` does not exist: ferry's
    own (also an IoError, as every error of a file ferry opens). A NUL byte is refused first, as
    open() refuses it (os.path.exists only says False)."""
    if b"\0" in os.fsencode(path):
        raise ValueError(f"{who}: embedded null byte in the path {os.fsdecode(path)!r}")
    if not os.path.exists(path):
        # The path in the message too: ferry's IoError prints its message, not `filename`.
        error = _io_class(errno.ENOENT)(errno.ENOENT, f"{who}: no such file: {_shown(path)}",
                                        _shown(path))
        error.op = "open"
        raise error


def load(path: PathLike, dtype: Any = None, shape: Any = None, device: Any = None,
         like: Any = None, file_offset: int = 0, **settings: Any) -> Any:
    """Reads a file into a new array: a ``.npy`` file by its header (its dtype and shape; a
    `dtype` or `shape` given must match), any other file as raw bytes, exactly as
    :func:`fromfile` (then `dtype` is required). The other arguments are those of
    :func:`fromfile`."""
    file_offset, count = _numpy_keywords("ferry.load", file_offset, settings)
    shape = _count_as_shape("ferry.load", shape, count)
    _missing("ferry.load", path)
    if not os.path.isfile(path):
        # Before the header is read with open(): a FIFO would wait there for a writer. ferry's
        # own open names what the path is (a FIFO, a device, a directory) and refuses it.
        from . import open as _open
        _open(path, "r").close()
    header = _npy_header(path)
    if header is None:
        if _is_zip(path):
            raise ValueError(f"ferry.load: {_shown(path)} is a .npz archive (a zip of .npy "
                             "files); ferry reads .npy and raw files (numpy.load reads .npz)")
        if dtype is None:
            raise TypeError(f"ferry.load: {_shown(path)} has no .npy header: pass dtype= to "
                            "read its raw bytes (or use ferry.fromfile)")
        return _load("ferry.load", path, dtype, shape, device, like, file_offset, settings)
    import numpy

    npy_shape, npy_dtype, data_offset = header
    where = f"ferry.load: {_shown(path)} is a .npy file of {npy_dtype} {npy_shape}"
    if dtype is not None and _items_of("ferry.load", dtype).numpy != npy_dtype:
        raise ValueError(f"{where}, not {_items_of('ferry.load', dtype).name}")
    if shape is not None and _shape_of(shape) != npy_shape:
        raise ValueError(f"{where}, not shape {_shape_of(shape)}")
    if file_offset:
        raise ValueError(f"{where}: file_offset is for raw files (use ferry.fromfile)")
    return _load("ferry.load", path, npy_dtype, npy_shape, device, like, data_offset, settings)


def _load(who: str, path: PathLike, dtype: Any, shape: Any, device: Any, like: Any,
          file_offset: int, settings: dict[str, Any]) -> Any:
    from . import open as _open

    items = _items_of(who, dtype)
    file_offset = _nonnegative(file_offset, "file_offset", who)
    _missing(who, path)
    on_cpu = device is not None and parse_device(device, who) is None
    framework = _framework_of(like) if like is not None else None
    if framework is None and items.numpy is None:
        framework = "torch"  # bfloat16 and its kin: PyTorch has them, NumPy does not
    if framework == "jax" and _import("jax") is None:
        raise ImportError(f"{who}: like='jax' but JAX is not installed")
    gpu = _gpu_framework() if not on_cpu and framework in (None, "jax") else None
    if framework is None:
        framework = "numpy" if on_cpu else gpu or ("numpy" if device is None else None)
        if framework is None:
            raise CudaError(f"{who}: device={device!r} but neither CuPy nor PyTorch sees a GPU; "
                            "pass device='cpu' for a NumPy array")
    if device is None:  # the framework's own default, by what the machine has
        on_cpu = (framework == "numpy" or (framework == "jax" and gpu is None)
                  or (framework == "torch" and not _torch_sees_gpu()))
        device = "cpu" if on_cpu else 0
    ordinal = parse_device(device, who)
    allocator = framework
    if framework == "jax":
        jax_allocator = "numpy" if ordinal is None else gpu
        if jax_allocator is None:
            raise CudaError(f"{who}: like='jax' on device={device!r} needs CuPy or PyTorch to "
                            "see a GPU (JAX arrays are allocated by them); pass device='cpu'")
        allocator = jax_allocator

    with _open(path, "r", **settings) as f:  # a missing file is ferry's FileNotFoundError
        size = f.size
        if file_offset > size:
            raise ValueError(f"{who}: file_offset {file_offset} is past the end of "
                             f"{_shown(path)} ({size} bytes)")
        if shape is None:
            available = size - file_offset
            if available % items.itemsize:
                raise ValueError(f"{who}: {_shown(path)} has {available} bytes from offset "
                                 f"{file_offset}, not a whole number of {items.name} items")
            dims: tuple[int, ...] = (available // items.itemsize,)
        else:
            dims = _shape_of(shape)
        array = _empty(allocator, dims, items, ordinal)
        _streams.settle(array)
        array = _fill(f, array, file_offset, path)
    if framework == "jax":
        import jax.numpy as jnp  # type: ignore[import]

        return jnp.from_dlpack(array)
    return array
