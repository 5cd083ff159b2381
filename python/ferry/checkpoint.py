"""Safetensors checkpoints into GPU or host memory: ``load_checkpoint`` for one file, an index or
a directory of shards, and the machinery behind ``ferry.safetensors``.

Loads are C++'s ``Checkpoint::load``, the loader ``ferry load`` runs: it schedules the parts (a
shard, or 1 GiB of it: one gathered request each, 4 in flight) with the GIL released, and asks
this module for each destination as it needs it, which the framework asked for allocates
(``torch.empty``, ``numpy.empty``, ``cupy.empty``) on the calling thread: GPU memory a part at a
time, so the next part's allocations run while the previous part reads, pageable host memory all
before the first read. By default
each tensor has its own allocation, so a user can free or replace any of them (and
``load_state_dict`` copies anyway); ``one_allocation=True`` puts every tensor in one backing
allocation instead, which saves allocator calls but frees nothing until every tensor is gone.
Into host memory, a local shard is mapped instead of read (the setting ``host_load``): its
tensors are views of a private copy-on-write mapping, as safetensors' are; a cold one's pages are
read in by parallel faults before the load returns.

Dtypes without a counterpart in the framework come back as raw bits of the same width, as
documented in docs/checkpoints.md: in NumPy (and CuPy) BF16 is uint16 and the F8 kinds uint8; in
every framework the packed MX kinds (F4, F6_E2M3, F6_E3M2) are flat uint8 arrays of their bytes.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _ferry, _progress, _streams
from ._arrays import parse_device
from ._errors import CudaError, Error

PathLike = Union[str, "os.PathLike[str]"]

# Alignment of each tensor inside one backing allocation (what cuMemAlloc gives), as
# Checkpoint::load aligns them; ferry.distributed lays out its own allocation with it.
_ALIGN = 256
# Host tensors this large get memory aligned to, and advised into, transparent huge pages.
_HUGE_PAGE = 2 << 20
# ferry's one dtype table (C++): bits and the torch and NumPy dtypes of every safetensors dtype.
_DTYPES = _ferry.safetensors_dtypes()
# The packed (sub-byte) kinds: a load gives their bytes as a flat uint8 array.
_PACKED = tuple(name for name, d in _DTYPES.items() if d.bits < 8)


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
    # Whether raw() gives pageable host memory: then a load allocates every tensor before any
    # read, as the C++ loader does (an allocation's mmap waits on the faults of the reads).
    host = True

    def raw(self, nbytes: int) -> Any:
        raise NotImplementedError

    def settle(self) -> None:
        """Before ferry writes into memory raw() gave: waits for the work queued where the
        framework orders that memory's reuse, which ferry's copies are not ordered after."""

    def view(self, raw: Any, entry: _Entry) -> Any:
        raise NotImplementedError

    def wrap(self, mapping: Any) -> Any:
        """The bytes of a mapped shard (_ferry.FileMapping) as what raw() gives, without a copy;
        it keeps the mapping alive."""
        raise NotImplementedError


class _Numpy(_Framework):
    name = "numpy"

    def __init__(self) -> None:
        import numpy
        self.np = numpy

    def raw(self, nbytes: int) -> Any:
        if nbytes >= _HUGE_PAGE:
            # NumPy asks for huge pages from 4 MiB up but does not align to 2 MiB: a 4 MiB array
            # faulted 513 times, and twice in memory that starts on a 2 MiB boundary (§55).
            return self.np.frombuffer(_ferry.HostMemory(nbytes), dtype=self.np.uint8)
        return self.np.empty(nbytes, dtype=self.np.uint8)

    def wrap(self, mapping: Any) -> Any:
        return self.np.frombuffer(mapping, dtype=self.np.uint8)

    def view(self, raw: Any, entry: _Entry) -> Any:
        if entry.dtype in _PACKED:
            return raw
        d = _DTYPES[entry.dtype]  # no NumPy dtype (BF16, F8): its bits, as uint16 or uint8
        return raw.view(self.np.dtype(d.numpy or f"uint{d.bits}")).reshape(entry.shape)


class _Cupy(_Numpy):
    name = "cupy"
    host = False

    def __init__(self, device: int) -> None:
        import cupy
        self.np = cupy
        self.device = device

    def raw(self, nbytes: int) -> Any:
        with self.np.cuda.Device(self.device):
            return self.np.empty(nbytes, dtype=self.np.uint8)

    def settle(self) -> None:
        # CuPy's memory pool reuses a block on the stream that freed it, as torch's does.
        _streams.settle_cupy(self.device)


class _Torch(_Framework):
    name = "pt"

    def __init__(self, device: Any) -> None:
        import torch
        self.torch = torch
        self.device = torch.device(device)
        self.host = self.device.type == "cpu"
        if self.device.type == "cuda" and not torch.cuda.is_available():
            # Before any allocation or I/O: torch's own failure would be an AssertionError
            # ("Torch not compiled with CUDA enabled") from inside the first allocation.
            raise CudaError(f"ferry: device {str(device)!r} asked of torch {torch.__version__}, "
                            "which sees no GPU (torch.cuda.is_available() is False); load to "
                            "device='cpu' instead")

    def settle(self) -> None:
        # torch's allocator hands a block freed on the current stream to the next allocation on
        # it at once, trusting that whatever writes it next is queued on that stream after the
        # work that read it. ferry's copies run on its own streams, which wait for the legacy
        # default stream's work only: under `torch.cuda.stream(s)` a read into a block the
        # consumer's queued work still reads would overwrite it first (issue 49).
        if not self.host:
            _streams.settle_torch(self.device)

    def raw(self, nbytes: int) -> Any:
        if self.host and nbytes >= _HUGE_PAGE:
            # torch's allocator neither aligns to 2 MiB nor asks for huge pages, so a 4 MiB
            # tensor faulted 1,024 times; in memory that starts on a 2 MiB boundary, advised, it
            # faults twice. The read that follows writes every byte (bench/NOTES.md §55).
            return self.torch.frombuffer(_ferry.HostMemory(nbytes), dtype=self.torch.uint8)
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def wrap(self, mapping: Any) -> Any:
        return self.torch.frombuffer(mapping, dtype=self.torch.uint8)

    def dtype(self, entry: _Entry) -> Any:
        dtype = getattr(self.torch, _DTYPES[entry.dtype].torch, None)
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
    JAX's own dtypes (ml_dtypes, named as torch names them) where it has them."""

    name = "jax"

    def __init__(self, device: Any) -> None:
        super().__init__()
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp, self.device = jax, jnp, device

    def view(self, raw: Any, entry: _Entry) -> Any:
        array = super().view(raw, entry)
        d = _DTYPES[entry.dtype]
        native = d.torch if not d.numpy and entry.dtype not in _PACKED else ""
        if native and hasattr(self.jnp, native):
            array = array.view(getattr(self.jnp, native))
        return self.jax.device_put(array, self.device)


def _gpu_ordinal(device: Any) -> Optional[int]:
    """The GPU ordinal a device names ("cuda:1", "cuda", 2, torch.device), None for the host (or
    None): parse_device's reading of str(device), an int as given."""
    if device is None:
        return None
    if isinstance(device, int):
        return device
    return parse_device(str(device), "ferry")


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


_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64",
                  "half": "float16", "double": "float64"}


def _dtype_name(dtype: Any) -> str:
    """A dtype given as a string, a torch dtype or a NumPy dtype (or type), as a bare name:
    "torch.bfloat16" and torch.bfloat16 are "bfloat16", numpy.float32 is "float32"."""
    if isinstance(dtype, str):
        name = dtype.strip()
        for prefix in ("torch.", "numpy.", "np."):
            if name.startswith(prefix):
                name = name[len(prefix):]
        return _DTYPE_ALIASES.get(name.lower(), name)
    if type(dtype).__module__ == "torch":  # torch.dtype, without importing torch
        return str(dtype).rsplit(".", 1)[-1]
    try:
        import numpy
        return str(numpy.dtype(dtype))
    except TypeError:
        return ""


def _target_dtype(fw: _Framework, dtype: Any) -> Any:
    """`dtype=` of a load, checked before any I/O: a floating-point dtype of the framework
    loaded into, given as a string, a torch dtype or a NumPy one. Only floating-point tensors
    are converted, so an integer target (which would silently truncate every weight) is
    refused, as is a name the framework has no dtype for."""
    if dtype is None:
        return None
    name = _dtype_name(dtype)
    if fw.name == "pt":
        target = getattr(fw.torch, name, None) if name else None
        if not isinstance(target, fw.torch.dtype):
            raise TypeError(f"ferry: dtype={dtype!r} is not a torch dtype (expected e.g. "
                            f"torch.bfloat16, 'bfloat16', 'float16', 'float32')")
        if not target.is_floating_point:
            raise TypeError(f"ferry: dtype={dtype!r}: only floating-point tensors are "
                            f"converted, so the target must be a floating-point dtype "
                            f"(torch.bfloat16, torch.float16, torch.float32...), not {target}")
        return target
    import numpy
    try:
        target = numpy.dtype(name or dtype)
    except TypeError:
        target = None
    # Nor are ml_dtypes' bfloat16 and float8 kinds NumPy's: registered from outside it
    # (isbuiltin 2), they are what numpy.dtype("bfloat16") finds once ml_dtypes is imported.
    if target is None or target.isbuiltin == 2:
        hint = ("; NumPy has no bfloat16: load with framework='pt', or convert with ml_dtypes"
                if name == "bfloat16" else "")
        raise TypeError(f"ferry: dtype={dtype!r} is not a NumPy dtype{hint}")
    if target.kind != "f":
        raise TypeError(f"ferry: dtype={dtype!r}: only floating-point tensors are converted, so "
                        f"the target must be a floating-point dtype (float16, float32, "
                        f"float64), not {target}")
    return target


def _f8_table(np: Any, kind: str) -> Any:
    """float32 values of the 256 codes of an 8-bit float kind (host NumPy)."""
    codes = np.arange(256, dtype=np.uint32)
    if kind == "F8_E8M0":  # exponent only: 2**(e - 127); 0xFF is NaN
        values = np.full(256, np.nan, dtype=np.float32)
        values[:255] = np.ldexp(np.float32(1), codes[:255].astype(np.int32) - 127)
        return values
    mant_bits, bias = (3, 7) if kind == "F8_E4M3" else (2, 15)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> mant_bits) & ((0x7F >> mant_bits))
    mant = codes & ((1 << mant_bits) - 1)
    normal = sign * np.ldexp(1.0 + mant / (1 << mant_bits), exp.astype(np.int32) - bias)
    subnormal = sign * np.ldexp(mant / (1 << mant_bits), 1 - bias)
    values = np.where(exp == 0, subnormal, normal).astype(np.float32)
    top = (0x7F >> mant_bits)
    if kind == "F8_E4M3":  # e4m3fn: no infinities; S.1111.111 is NaN
        values[(codes & 0x7F) == 0x7F] = np.nan
    else:  # e5m2: IEEE-like, all-ones exponent is infinity (mantissa 0) or NaN
        values[(exp == top) & (mant == 0)] = sign[(exp == top) & (mant == 0)] * np.inf
        values[(exp == top) & (mant != 0)] = np.nan
    return values


def _as_float(fw: _Framework, t: Any, kind: str) -> Any:
    """The values of a BF16 or F8 tensor that NumPy (or CuPy) holds as raw bits, as float32."""
    np = fw.np
    if _DTYPES[kind].bits == 16:  # BF16, the top half of a float32
        return (t.astype(np.uint32) << 16).view(np.float32)
    import numpy
    return np.asarray(_f8_table(numpy, kind))[t]


def _convert(tensors: Dict[str, Any], fw: _Framework, dtype: Any,
             kinds: Dict[str, str]) -> None:
    """Converts every floating-point tensor to `dtype` (checked by _target_dtype) where it
    lives (on the GPU for GPU tensors), one at a time, so peak memory grows by one tensor, not
    the checkpoint. `kinds` names each tensor's safetensors dtype: NumPy holds BF16 and F8 as
    raw bits, which are decoded first rather than left unconverted."""
    for name, t in tensors.items():
        kind = kinds[name]
        if not _DTYPES[kind].convertible:
            continue
        if fw.name == "pt":
            if t.dtype != dtype:
                tensors[name] = t.to(dtype)
            continue
        if not _DTYPES[kind].numpy and fw.name in ("numpy", "cupy"):  # BF16 or F8 as raw bits
            t = _as_float(fw, t, kind)
        if t.dtype != dtype:
            t = t.astype(dtype)
        tensors[name] = t


class PendingRead:
    """``Checkpoint.start_read_into``'s reads in flight. ``result()`` (once) waits for them, the
    GIL released, and returns the LoadReport, which becomes the checkpoint's ``last_report`` in
    the thread calling it. Dropped unwaited, it waits for its reads: nothing writes into the
    destinations after it is gone."""

    def __init__(self, ckpt: "Checkpoint", pending: Any) -> None:
        self._ckpt, self._pending = ckpt, pending

    def result(self) -> Any:
        report = self._pending.wait()
        self._ckpt.last_report = _last[0] = report
        return report


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
            raise CheckpointError(f"safetensors {_ferry.shown_path(self.path)}: tensor '{name}': no such tensor "
                                  f"in the checkpoint") from None

    def read_into(self, targets: Iterable[Tuple[Any, ...]]) -> Any:
        """Reads [(name, destination[, begin, length]), ...]: bytes [begin, begin + length) of
        each named tensor (all of it by default; length -1: to its end) into `destination`, a
        writable torch tensor, NumPy or CuPy array (or buffer) that holds them, all in host memory
        or all on one GPU. One gathered request per shard, the GIL released. Returns the
        LoadReport, also last_load_report()'s."""
        return self.start_read_into(targets).result()

    def start_read_into(self, targets: Iterable[Tuple[Any, ...]]) -> "PendingRead":
        """read_into's reads submitted and not waited for, so that this thread goes on meanwhile.
        A target may also give the byte `at` of the destination where its bytes go (fifth), or be
        (name, destination, [(begin, length), ...]): runs of the tensor back to back from byte
        0 (a slice's thousands of runs in one target). ``result()`` on what it returns waits."""
        rows = [(self.entry(t[0]).index,) + tuple(t[1:]) for t in targets]
        return PendingRead(self, self._c.start_read_into(rows))

    def load(self, framework: str = "pt", device: Any = "cpu",
             names: Optional[Iterable[str]] = None, dtype: Any = None,
             one_allocation: bool = False, progress: Any = None) -> Dict[str, Any]:
        callback = _progress.reporter(progress, "loading")
        fw = _framework(framework, device)
        dtype = _target_dtype(fw, dtype)
        if names is None:
            chosen = list(self.entries.values())
        else:
            chosen = sorted({self.entry(n).index: self.entry(n) for n in names}.values(),
                            key=lambda e: e.index)
        if not chosen:  # Checkpoint::load takes no names as all of them
            self.last_report = _last[0] = _ferry.LoadReport()
        try:
            raws = self._allocate_and_read(fw, chosen, one_allocation, callback) if chosen else []
        finally:
            _progress.close(callback)
        out = {e.name: fw.view(raw, e) for e, raw in zip(chosen, raws)}
        if dtype is not None:
            _convert(out, fw, dtype, {e.name: e.dtype for e in chosen})
        return out

    def _allocate_and_read(self, fw: _Framework, chosen: List[_Entry], one_allocation: bool,
                           progress: Optional[_progress.Callback]) -> List[Any]:
        """The `chosen` tensors' bytes, one framework array each (views of one with
        one_allocation), read by the C++ loader that ``ferry load`` runs (Checkpoint::load): it
        calls fw.raw from this thread as it needs memory, the GIL released in between, and every
        read it started has finished when it returns or raises. Into host memory, a local shard
        (host_load) comes back as views of a private mapping of it, which fw.wrap makes an array
        of (a cold one's pages read in first): writes to them never reach the file."""
        names = [] if len(chosen) == len(self.entries) else [e.name for e in chosen]
        fw.settle()  # every allocation below is made from this thread, in this call
        report, allocations, places = self._c.load(fw.raw, names, fw.host, one_allocation,
                                                    progress, fw.wrap if fw.host else None)
        self.last_report = _last[0] = report
        return [allocations[a] if o == 0 and len(allocations[a]) == e.nbytes
                else allocations[a][o:o + e.nbytes] for e, (a, o) in zip(chosen, places)]


def load_checkpoint(path_or_index: PathLike, device: Any = "cpu", framework: str = "pt",
                    dtype: Any = None, names: Optional[Iterable[str]] = None,
                    one_allocation: bool = False, progress: Any = None, shard: Any = None,
                    **settings: Any) -> Dict[str, Any]:
    """Every tensor (or those in `names`) of a checkpoint: a .safetensors file, a
    model.safetensors.index.json, or a directory of shards. `device` is "cpu", "cuda", "cuda:N"
    or an ordinal; `dtype` converts floating-point tensors where they land; `progress`: True for
    a bar on a terminal, or a callable progress(done_bytes, total_bytes), called from this thread
    (ferry._progress); `shard`: each tensor's slice for this rank, as ``ferry.iter_weights`` takes
    it (docs/engines.md); keyword arguments override ferry's settings (task_size="8MiB"...)."""
    if shard is not None:
        from . import _weights
        return _weights.load_sharded(path_or_index, device, framework, dtype, names, shard,
                                     one_allocation or progress, settings)
    return Checkpoint(path_or_index, **settings).load(framework, device, names, dtype,
                                                      one_allocation, progress)


def load_bytes(data: Any, framework: str = "pt") -> Dict[str, Any]:
    """Every tensor of a whole safetensors file held in `data` (bytes, bytearray, memoryview), as
    safetensors' ``load`` gives them: host tensors that own their memory, in the order of their
    bytes. The header is validated as a file's is (a bad one raises CheckpointError)."""
    data = bytes(data)
    _, rows = _ferry.safetensors_parse(data)
    fw = _framework(framework, "cpu")
    import numpy as np
    out: Dict[str, Any] = {}
    for i, row in enumerate(rows):
        entry = _Entry(i, tuple(row) + (0,))
        raw = fw.raw(entry.nbytes)
        if entry.nbytes:
            src = np.frombuffer(data, dtype=np.uint8, count=entry.nbytes, offset=entry.file_offset)
            (raw.numpy() if fw.name == "pt" else raw)[:] = src
        out[entry.name] = fw.view(raw, entry)
    return out


def last_load_report() -> Any:
    """The LoadReport (bytes, seconds, one route report per shard) of this process's most
    recent checkpoint read, or None."""
    return _last[0]


_last: List[Any] = [None]

__all__: Sequence[str] = ["Checkpoint", "CheckpointError", "last_load_report", "load_checkpoint",
                          "save_checkpoint"]


def save_checkpoint(tensors: Dict[str, Any], directory: PathLike, *,
                    max_shard_size: Union[int, str, None] = None,
                    metadata: Optional[Dict[str, str]] = None, durable: bool = True,
                    asynchronous: bool = False, snapshot: bool = False,
                    progress: Any = None) -> Any:
    """Saves `tensors` (torch tensors on CPU or CUDA, or NumPy arrays) into `directory` as
    transformers' save_pretrained lays them out: shards of at most `max_shard_size` (bytes, or
    "5GB", "500MiB"; None: one shard) cut as huggingface_hub's split_torch_state_dict_into_shards
    cuts them (a larger tensor gets a shard of its own), named model-00001-of-0000N.safetensors
    (model.safetensors for one), and model.safetensors.index.json, with metadata.total_size and
    metadata.total_parameters, written last (also for one shard: docs/checkpoints.md says how
    this and the rest differ from save_pretrained). A checkpoint
    already in `directory` stays loadable, whole, until the new index replaces it
    (docs/checkpoints.md). Returns a ``SaveReport``; with ``asynchronous=True`` a Future of it
    (see ferry.safetensors.torch.save_file for ``snapshot``). ``progress``: True for a bar on a
    terminal, or a callable progress(done_bytes, total_bytes), called from the thread that runs
    the save; an exception it raises ends the save, the old checkpoint whole (ferry._progress)."""
    from . import _save
    return _save.save_checkpoint(tensors, directory, max_shard_size=max_shard_size,
                                 metadata=metadata, durable=durable, asynchronous=asynchronous,
                                 snapshot_first=snapshot, progress=progress)
