"""Saving tensors in the safetensors format through ferry's write engine: the checks safetensors
0.8 makes before it writes (same exception types and wording class), the rows handed to the C++
writer, and the asynchronous form. docs/checkpoints.md ("Saving") has the layout and the save
protocol; ``ferry.safetensors.torch``/``numpy`` and ``ferry.save_checkpoint`` are the entry points.

Asynchronous saves (``asynchronous=True``) return a ``concurrent.futures.Future`` once the
tensors are captured: their dtype, shape and memory address are read, and references to them
are held until the write completes. The bytes are read from that memory while the future runs,
so the caller must not modify the tensors until ``future.result()`` returns (forward and
backward passes may run; an optimizer step may not). ``snapshot=True`` copies every tensor
first (on its own device: GPU memory for GPU tensors) and returns once the copies are made; the
caller may then change the originals at once, at the cost of that memory until the save ends.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

from . import _ferry, _progress, _streams

PathLike = Union[str, "os.PathLike[str]"]
# (name, dtype, shape, data pointer, nbytes, storage, storage bytes): rows with the same nonzero
# storage are tensors of one torch storage, which save_checkpoint keeps in one shard and sizes by
# the storage's bytes, as huggingface_hub does (TensorSource::storage, storage_bytes).
Row = Tuple[str, str, Tuple[int, ...], int, int, int, int]

# The safetensors dtype of each torch and NumPy dtype, from ferry's one dtype table (C++).
_TORCH_FORMAT = {d.torch: name for name, d in _ferry.safetensors_dtypes().items() if d.torch}
_NUMPY_FORMAT = {d.numpy: name for name, d in _ferry.safetensors_dtypes().items() if d.numpy}

_executor_lock = threading.Lock()
_executor: Optional[ThreadPoolExecutor] = None


def check_metadata(metadata: Any) -> Optional[Dict[str, str]]:
    """safetensors takes metadata as a str -> str dict (or None); anything else is a TypeError."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise TypeError(f"ferry: metadata must be a dict of str to str, not "
                        f"{type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"ferry: metadata must map str to str; {k!r}: {v!r} is "
                            f"{type(k).__name__} -> {type(v).__name__}")
        _check_text(k, "metadata key")
        _check_text(v, f"metadata value of {k!r}")
    return dict(metadata)


def _check_text(text: str, what: str) -> None:
    """A name the file format stores as UTF-8: a lone surrogate (from a bytes name decoded with
    surrogateescape, say) has no UTF-8 form, so it is refused here, naming it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"ferry: {what} {text!r} is not valid text: {text[e.start]!r} at index "
                         f"{e.start} is a lone surrogate, which has no UTF-8 form (safetensors "
                         f"stores names as UTF-8)") from None


def _path_arg(path: PathLike) -> Any:
    """A path for the C++ writer: str as it is, else the bytes the OS would get (a name holding
    undecodable bytes arrives as surrogate escapes, which UTF-8 cannot carry)."""
    text = os.fspath(path)
    try:
        if isinstance(text, str):
            text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return os.fsencode(text)


def _is_torch(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


# ------------------------------------------------------------------------------ torch checks


def _storage(t: Any) -> Tuple[int, int]:
    """(data pointer, bytes) of the storage behind `t` (torch 1.13 has no untyped_storage)."""
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except AttributeError:
        s = t.storage()
        return s.data_ptr(), s.size() * t.element_size()
    except NotImplementedError:
        return 0, 0


def _end(t: Any) -> int:
    return t.data_ptr() + t.numel() * t.element_size() if t.numel() else t.data_ptr()


def _shared_groups(tensors: Dict[str, Any]) -> List[Set[str]]:
    """Names whose memory overlaps, grouped as safetensors groups them: tensors of one storage
    (same device, address and size), split where their byte ranges do not overlap."""
    by_storage: Dict[Any, Set[str]] = defaultdict(set)
    for k, v in tensors.items():
        if v.device.type == "meta":
            continue
        ptr, size = _storage(v)
        if ptr != 0 and size != 0:
            by_storage[(str(v.device), ptr, size)].add(k)
    groups: List[Set[str]] = []
    for names in sorted(by_storage.values(), key=sorted):
        if len(names) < 2:
            groups.append(names)
            continue
        areas = sorted((tensors[n].data_ptr(), _end(tensors[n]), n) for n in names)
        _, last_stop, first = areas[0]
        groups.append({first})
        for start, stop, name in areas[1:]:
            if start >= last_stop:
                groups.append({name})
            else:
                groups[-1].add(name)
            last_stop = stop
    return groups


def _torch_rows(tensors: Dict[str, Any], keep: List[Any]) -> List[Row]:
    import torch
    sparse = [k for k, v in tensors.items() if v.layout != torch.strided]
    if sparse:
        raise ValueError(f"You are trying to save a sparse tensors: `{sparse}` which this library "
                         f"does not support. Make it dense first with `.to_dense()`.")
    failing = [names for names in _shared_groups(tensors) if len(names) > 1]
    if failing:
        raise RuntimeError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and potential "
            f"differences when loading them again: {failing}. Save each storage once (e.g. "
            f"safetensors' save_model, which drops the duplicates), or clone the views.")
    rows: List[Row] = []
    # huggingface_hub's storage id, (device, storage address, storage bytes), numbered from 1 in
    # the order first seen. Empty tensors all have address 0 and share one, as they do there; a
    # tensor without a storage it can see counts as address 0 and its own bytes there too.
    storages: Dict[Tuple[str, int, int], int] = {}
    for k, v in tensors.items():
        if not v.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{k}` which is not allowed. It "
                f"either means you are trying to save tensors which are reference of each other "
                f"in which case it's recommended to save only the full tensors, and reslice at "
                f"load time, or simply call `.contiguous()` on your tensor to pack it before "
                f"saving.")
        name = str(v.dtype).split(".")[-1]
        fmt = _TORCH_FORMAT.get(name)
        if fmt is None:
            raise TypeError(f"ferry: tensor '{k}' is {v.dtype}, which safetensors has no dtype "
                            f"for")
        shape = tuple(int(d) for d in v.shape)
        if fmt == "F4" and shape:  # two values a byte: the header counts values
            shape = shape[:-1] + (shape[-1] * 2,)
        nbytes = v.numel() * v.element_size()
        if v.device.type not in ("cpu", "cuda"):
            raise ValueError(f"ferry: tensor '{k}' is on {v.device}; ferry saves from CPU and "
                             f"CUDA memory")
        ptr, size = _storage(v)
        storage_bytes = size if ptr else nbytes
        storage = storages.setdefault((str(v.device), ptr, storage_bytes), len(storages) + 1)
        keep.append(v)
        rows.append((k, fmt, shape, v.data_ptr() if nbytes else 0, nbytes, storage,
                     storage_bytes))
    _streams.wait_for_torch(keep)
    return rows


def _numpy_rows(tensors: Dict[str, Any], keep: List[Any]) -> List[Row]:
    import numpy as np
    rows: List[Row] = []
    for k, v in tensors.items():
        if not isinstance(v, np.ndarray):
            raise ValueError(f"Key `{k}` is invalid, expected np.ndarray but received {type(v)}")
        if not v.flags.c_contiguous:
            raise ValueError(f"You are trying to save a non contiguous tensor: `{k}` which is not "
                             f"allowed. Call `np.ascontiguousarray` on it before saving.")
        if v.dtype.byteorder == ">" or (v.dtype.byteorder == "=" and sys.byteorder == "big"):
            v = v.byteswap().view(v.dtype.newbyteorder("<"))
        fmt = _NUMPY_FORMAT.get(v.dtype.name)
        if fmt is None:
            raise TypeError(f"ferry: array '{k}' is {v.dtype}, which safetensors has no dtype for")
        keep.append(v)
        # No storage (0), as huggingface_hub's numpy splitter gives none.
        rows.append((k, fmt, tuple(int(d) for d in v.shape), v.ctypes.data if v.nbytes else 0,
                     int(v.nbytes), 0, 0))
    return rows


def rows_of(tensors: Any, framework: str, keep: List[Any]) -> List[Row]:
    """The rows the C++ writer takes, after safetensors' checks for `framework` ("pt",
    "numpy", or "any": each value's own)."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, tensor] but received {type(tensors)}")
    for k in tensors:
        if not isinstance(k, str):
            raise TypeError(f"ferry: tensor names must be str, not {type(k).__name__} ({k!r})")
        _check_text(k, "tensor name")
    if framework == "any":
        framework = "pt" if tensors and all(_is_torch(v) for v in tensors.values()) else "numpy"
    if framework == "pt":
        for k, v in tensors.items():
            if not _is_torch(v):
                raise ValueError(f"Key `{k}` is invalid, expected torch.Tensor but received "
                                 f"{type(v)}")
        return _torch_rows(tensors, keep)
    return _numpy_rows(tensors, keep)


def snapshot(tensors: Dict[str, Any]) -> Dict[str, Any]:
    """A copy of every tensor on its own device, made before returning."""
    out = {k: (v.clone() if _is_torch(v) else v.copy()) for k, v in tensors.items()}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and any(
            _is_torch(v) and v.is_cuda for v in out.values()):
        torch.cuda.synchronize()
    return out


def to_bytes(tensors: Any, framework: str, metadata: Any) -> bytes:
    """The whole file as bytes (safetensors' ``save``)."""
    keep: List[Any] = []
    rows = rows_of(tensors, framework, keep)
    header, order = _ferry.safetensors_layout(rows, check_metadata(metadata))
    parts = [header]
    for i in order:
        value = keep[i]
        if _is_torch(value) and value.device.type != "cpu":
            value = value.cpu()
            parts.append(ctypes.string_at(value.data_ptr(), rows[i][4]) if rows[i][4] else b"")
        else:
            parts.append(ctypes.string_at(rows[i][3], rows[i][4]) if rows[i][4] else b"")
    return b"".join(parts)


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ferry-save")
        return _executor


def run(call: Any, asynchronous: bool) -> Any:
    """Runs `call` now, or on ferry's save threads returning a Future."""
    if not asynchronous:
        return call()
    return _pool().submit(call)


def parse_size(size: Union[int, str, None]) -> int:
    """transformers' max_shard_size: an int of bytes or a size read as every ferry setting reads
    one (C++'s parse_size): "5GB" (10^9), "500MiB" (2^20)..."""
    if size is None:
        return 0
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"ferry: max_shard_size must be positive, not {size}")
        return size
    return _ferry.parse_size(str(size), "max_shard_size")


def _write(tensors: Any, framework: str, progress: Any, snapshot_first: bool,
           asynchronous: bool, write: Any) -> Any:
    """``write(rows, callback)`` of `tensors` (copied first where `snapshot_first`, once checked
    as safetensors checks them), now or on ferry's save thread: its report, or a Future of it.
    `callback` is behind the ``progress=`` argument (ferry._progress); a bar it drew is erased
    when the write ends, however it ends."""
    if snapshot_first:
        rows_of(tensors, framework, [])  # refuse what safetensors refuses before copying
        tensors = snapshot(tensors)
    keep: List[Any] = []
    rows = rows_of(tensors, framework, keep)

    def call() -> Any:
        callback = _progress.reporter(progress, "saving")
        try:
            report = write(rows, callback)
        finally:
            _progress.close(callback)
        del keep[:]
        return report

    return run(call, asynchronous)


def save_file(tensors: Any, filename: PathLike, metadata: Any, framework: str, *,
              durable: bool, asynchronous: bool, snapshot_first: bool,
              progress: Any = None) -> Any:
    _progress.check(progress)
    metadata = check_metadata(metadata)
    path = _path_arg(filename)
    result = _write(tensors, framework, progress, snapshot_first, asynchronous,
                    lambda rows, callback: _ferry.save_file(rows, path, metadata, durable,
                                                            progress=callback))
    return result if asynchronous else None


def save_checkpoint(tensors: Any, directory: PathLike, *, max_shard_size: Any = None,
                    metadata: Any = None, durable: bool = True, asynchronous: bool = False,
                    snapshot_first: bool = False, progress: Any = None) -> Any:
    _progress.check(progress)
    metadata = check_metadata(metadata)
    limit = parse_size(max_shard_size)
    path = _path_arg(directory)
    return _write(tensors, "any", progress, snapshot_first, asynchronous,
                  lambda rows, callback: _ferry.save_checkpoint(rows, path, metadata, durable,
                                                                limit, progress=callback))


__all__: Sequence[str] = ()
