"""Safetensors checkpoints into GPU or host memory: ``load_checkpoint`` for one file, an index or
a directory of shards, and the machinery behind ``ferry.safetensors``.

Destinations are allocated by the framework asked for (``torch.empty``, ``numpy.empty``,
``cupy.empty``), a part of the checkpoint at a time (a shard, or 1 GiB of it): each part's read,
one gathered request through a C++ call with the GIL released, starts as soon as its tensors
exist, so the next part's allocations run while it reads, and the parts read at once. By default
each tensor has its own allocation, so a user can free or replace any of them (and
``load_state_dict`` copies anyway); ``one_allocation=True`` puts every tensor in one backing
allocation instead, which saves allocator calls but frees nothing until every tensor is gone.

Dtypes without a counterpart in the framework come back as raw bits of the same width, as
documented in docs/checkpoints.md: in NumPy (and CuPy) BF16 is uint16 and the F8 kinds uint8; in
every framework the packed MX kinds (F4, F6_E2M3, F6_E3M2) are flat uint8 arrays of their bytes.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _ferry
from ._errors import Error

PathLike = Union[str, "os.PathLike[str]"]

# Alignment of each tensor inside one backing allocation (what cuMemAlloc gives).
_ALIGN = 256
# A part of a load: the tensors of one shard, cut where they pass this many bytes.
_PART_BYTES = 1 << 30
# Parts read at once (each a gathered request spread over ferry's workers).
_PARTS_AT_ONCE = 4
_PACKED = ("F4", "F6_E2M3", "F6_E3M2")


class CheckpointError(Error, ValueError):
    """A checkpoint that does not describe its bytes; ``filename`` and ``tensor`` name the file
    and (where one is at fault) the tensor."""

    filename: str = ""
    tensor: str = ""


CheckpointError.__module__ = "ferry"


class _Entry:
    """One tensor of an opened checkpoint, as the header describes it."""

    __slots__ = ("index", "name", "dtype", "shape", "file_offset", "nbytes", "shard")

    def __init__(self, index: int, row: Tuple[Any, ...]) -> None:
        self.index = index
        self.name, self.dtype, self.shape, self.file_offset, self.nbytes, self.shard = row
        self.shape = tuple(self.shape)


# --------------------------------------------------------------------------------- frameworks


class _Framework:
    """How one framework allocates a tensor's bytes and views them as the tensor."""

    name = ""

    def raw(self, nbytes: int) -> Any:
        raise NotImplementedError

    def view(self, raw: Any, entry: _Entry) -> Any:
        raise NotImplementedError


_NUMPY_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "F16": "float16", "BF16": "uint16", "U32": "uint32", "I32": "int32", "F32": "float32",
    "U64": "uint64", "I64": "int64", "F64": "float64", "C64": "complex64",
    "F8_E4M3": "uint8", "F8_E5M2": "uint8", "F8_E8M0": "uint8",
}


class _Numpy(_Framework):
    name = "numpy"

    def __init__(self) -> None:
        import numpy
        self.np = numpy

    def raw(self, nbytes: int) -> Any:
        return self.np.empty(nbytes, dtype=self.np.uint8)

    def view(self, raw: Any, entry: _Entry) -> Any:
        if entry.dtype in _PACKED:
            return raw
        return raw.view(self.np.dtype(_NUMPY_NAMES[entry.dtype])).reshape(entry.shape)


class _Cupy(_Numpy):
    name = "cupy"

    def __init__(self, device: int) -> None:
        import cupy
        self.np = cupy
        self.device = device

    def raw(self, nbytes: int) -> Any:
        with self.np.cuda.Device(self.device):
            return self.np.empty(nbytes, dtype=self.np.uint8)


_TORCH_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "F16": "float16", "BF16": "bfloat16", "U32": "uint32", "I32": "int32", "F32": "float32",
    "U64": "uint64", "I64": "int64", "F64": "float64", "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
}


class _Torch(_Framework):
    name = "pt"

    def __init__(self, device: Any) -> None:
        import torch
        self.torch = torch
        self.device = torch.device(device)

    def raw(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def dtype(self, entry: _Entry) -> Any:
        dtype = getattr(self.torch, _TORCH_NAMES[entry.dtype], None)
        if dtype is None:
            raise TypeError(f"ferry: tensor '{entry.name}' is {entry.dtype}, which torch "
                            f"{self.torch.__version__} has no dtype for")
        return dtype

    def view(self, raw: Any, entry: _Entry) -> Any:
        if entry.dtype in _PACKED:
            return raw
        return raw.view(self.dtype(entry)).reshape(entry.shape)


class _Jax(_Numpy):
    """JAX arrays: read into host memory, then placed on the device; BF16 and the F8 kinds get
    JAX's own dtypes (ml_dtypes) where it has them."""

    name = "jax"

    def __init__(self, device: Any) -> None:
        super().__init__()
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp, self.device = jax, jnp, device

    def view(self, raw: Any, entry: _Entry) -> Any:
        array = super().view(raw, entry)
        native = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                  "F8_E8M0": "float8_e8m0fnu"}.get(entry.dtype)
        if native is not None and hasattr(self.jnp, native):
            array = array.view(getattr(self.jnp, native))
        return self.jax.device_put(array, self.device)


def _gpu_ordinal(device: Any) -> Optional[int]:
    """The GPU ordinal a device names ("cuda:1", "cuda", 2, torch.device), None for the host."""
    if device is None:
        return None
    if isinstance(device, int):
        return device
    text = str(device)
    if text == "cpu":
        return None
    if text == "cuda":
        return 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return int(text[5:])
    raise ValueError(f"ferry: device {device!r} is not 'cpu', 'cuda', 'cuda:N' or an ordinal")


def _framework(framework: str, device: Any) -> _Framework:
    gpu = _gpu_ordinal(device)
    if framework in ("pt", "torch", "pytorch"):
        return _Torch("cpu" if gpu is None else f"cuda:{gpu}")
    if framework in ("np", "numpy"):
        if gpu is not None:
            raise ValueError(f"ferry: numpy arrays live in host memory, not on device {device!r}")
        return _Numpy()
    if framework == "cupy":
        return _Cupy(0 if gpu is None else gpu)
    if framework in ("jax", "flax"):
        import jax
        target = jax.devices("cpu")[0] if gpu is None else jax.devices("gpu")[gpu]
        return _Jax(target)
    raise ValueError(f"ferry: framework {framework!r} is not one of pt, numpy, cupy, jax")


# --------------------------------------------------------------------------------- loading


def _convert(tensors: Dict[str, Any], fw: _Framework, dtype: Any) -> None:
    """Converts every floating-point tensor to `dtype` where it lives (on the GPU for GPU
    tensors), one at a time, so peak memory grows by one tensor, not the checkpoint."""
    for name, t in tensors.items():
        if fw.name == "pt":
            if t.is_floating_point() and t.dtype != dtype:
                tensors[name] = t.to(dtype)
        elif fw.np.issubdtype(t.dtype, fw.np.floating) and t.dtype != dtype:
            tensors[name] = t.astype(dtype)


class Checkpoint:
    """An opened checkpoint: its tensors (validated headers), metadata and loads."""

    def __init__(self, path: PathLike, direct: bool = False, **settings: Any) -> None:
        from ._settings import as_text
        self.path = os.fsdecode(path)  # str, bytes or PathLike; the C++ side refuses a NUL
        self._c = _ferry.Checkpoint(self.path, direct, as_text(settings))
        self.entries: Dict[str, _Entry] = {
            row[0]: _Entry(i, row) for i, row in enumerate(self._c.tensors())}
        self.last_report: Optional[_ferry.LoadReport] = None

    @property
    def shards(self) -> List[str]:
        return list(self._c.shards)

    def metadata(self, shard: int = 0) -> Dict[str, str]:
        return dict(self._c.metadata(shard))

    @property
    def index_metadata(self) -> Dict[str, Any]:
        return json.loads(self._c.index_metadata_json)

    def entry(self, name: str) -> _Entry:
        try:
            return self.entries[name]
        except KeyError:
            raise CheckpointError(f"safetensors {self.path}: tensor '{name}': no such tensor "
                                  f"in the checkpoint") from None

    def load(self, framework: str = "pt", device: Any = "cpu",
             names: Optional[Iterable[str]] = None, dtype: Any = None,
             one_allocation: bool = False) -> Dict[str, Any]:
        fw = _framework(framework, device)
        if names is None:
            chosen = list(self.entries.values())
        else:
            chosen = sorted({self.entry(n).index: self.entry(n) for n in names}.values(),
                            key=lambda e: e.index)
        out: Dict[str, Any] = {}
        if one_allocation:
            offsets, total = [], 0
            for e in chosen:
                offsets.append(total)
                total += -(-e.nbytes // _ALIGN) * _ALIGN
            backing = fw.raw(total)
            raws = [backing[o:o + e.nbytes] for o, e in zip(offsets, chosen)]
            targets = [(e.index, raw) for e, raw in zip(chosen, raws) if e.nbytes]
            self.last_report = _last[0] = self._c.read_into(targets)
        else:
            raws, self.last_report = self._allocate_and_read(fw, chosen)
            _last[0] = self.last_report
        for e, raw in zip(chosen, raws):
            out[e.name] = fw.view(raw, e)
        if dtype is not None:
            _convert(out, fw, dtype)
        return out

    def _allocate_and_read(self, fw: _Framework,
                           chosen: List[_Entry]) -> Tuple[List[Any], Any]:
        """One destination per tensor, allocated a part at a time; each part's read starts once
        its destinations exist (on a thread of a small pool, the GIL released in the read), so
        allocating the next part overlaps it. Every read that started has finished when this
        returns or raises, so no destination is freed under a read."""
        parts: List[List[int]] = []
        shard, part_bytes = None, 0
        for k, e in enumerate(chosen):
            if not parts or e.shard != shard or part_bytes >= _PART_BYTES:
                parts.append([])
                shard, part_bytes = e.shard, 0
            parts[-1].append(k)
            part_bytes += e.nbytes
        raws: List[Any] = [None] * len(chosen)
        start = time.perf_counter()
        futures = []
        with ThreadPoolExecutor(max_workers=max(1, min(_PARTS_AT_ONCE, len(parts))),
                                thread_name_prefix="ferry-load") as pool:
            # Leaving the block, on success or on a failed allocation, waits for every read.
            for part in parts:
                targets = []
                for k in part:
                    raws[k] = fw.raw(chosen[k].nbytes)
                    if chosen[k].nbytes:
                        targets.append((chosen[k].index, raws[k]))
                if targets:
                    futures.append(pool.submit(self._c.read_into, targets))
        reports = [f.result() for f in futures]  # the first failure, if any, raises here
        return raws, _ferry.merge_load_reports(reports, time.perf_counter() - start)

    def read_rows(self, fw: _Framework, entry: _Entry, first: int, stop: int) -> Any:
        """Rows [first, stop) of dimension 0 of `entry`, as an array of shape (stop-first, ...)."""
        row = entry.nbytes // entry.shape[0] if entry.shape and entry.shape[0] else 0
        raw = fw.raw(row * (stop - first))
        if row * (stop - first):
            self.last_report = _last[0] = self._c.read_into(
                [(entry.index, raw, row * first, row * (stop - first))])
        part = _Entry(entry.index, (entry.name, entry.dtype, (stop - first,) + entry.shape[1:],
                                    entry.file_offset, row * (stop - first), entry.shard))
        return fw.view(raw, part)


def load_checkpoint(path_or_index: PathLike, device: Any = "cpu", framework: str = "pt",
                    dtype: Any = None, names: Optional[Iterable[str]] = None,
                    one_allocation: bool = False, **settings: Any) -> Dict[str, Any]:
    """Every tensor (or those in `names`) of a checkpoint: a .safetensors file, a
    model.safetensors.index.json, or a directory of shards. `device` is "cpu", "cuda", "cuda:N"
    or an ordinal; `dtype` converts floating-point tensors where they land; keyword arguments
    override ferry's settings (task_size="8MiB"...)."""
    return Checkpoint(path_or_index, **settings).load(framework, device, names, dtype,
                                                      one_allocation)


def last_load_report() -> Any:
    """The LoadReport (bytes, seconds, one route report per shard) of this process's most
    recent checkpoint read, or None."""
    return _last[0]


_last: List[Any] = [None]

__all__: Sequence[str] = ["Checkpoint", "CheckpointError", "last_load_report", "load_checkpoint"]
