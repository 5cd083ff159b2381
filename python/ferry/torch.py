"""ferry.torch: ``torch.save`` and ``torch.load`` for training state, through ferry (issue 51).

Switching is one line each::

    ferry.torch.save(optimizer.state_dict(), "optimizer.pt")
    state = ferry.torch.load("optimizer.pt", map_location="cuda:0")

``save`` writes the zip ``torch.save`` writes, which stock ``torch.load`` reads (also with
``weights_only=True``), crash-safe: a temporary file beside the destination, fsynced, renamed over
it, the folder fsynced. Each storage's bytes start at a multiple of 4096 of the file and go
through ferry's write path straight from host or GPU memory. ``load`` reads stock ``torch.save``
files and ferry's: data.pkl through ferry's restricted unpickler (the classes ``weights_only=True``
allows for state dicts), the storages by ferry's gathered reads into the target device. What is
not supported is in docs/training.md ("ferry.torch").
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch

from . import _ferry, _progress, _streams
from ._save import _path_arg, _storage
from .checkpoint import CheckpointError

__all__ = ["save", "load", "last_report"]

_last: List[Any] = [None]

# The storage class torch.save names for each dtype (torch.<Class>, loadable by 1.13 and 2.x).
_STORAGE_CLASS = {
    torch.bool: "BoolStorage", torch.uint8: "ByteStorage", torch.int8: "CharStorage",
    torch.int16: "ShortStorage", torch.int32: "IntStorage", torch.int64: "LongStorage",
    torch.float16: "HalfStorage", torch.bfloat16: "BFloat16Storage",
    torch.float32: "FloatStorage", torch.float64: "DoubleStorage",
    torch.complex64: "ComplexFloatStorage", torch.complex128: "ComplexDoubleStorage",
}
_DTYPE_OF_CLASS = {"torch." + name: dtype for dtype, name in _STORAGE_CLASS.items()}
_PLAIN = (str, int, float, bool, type(None))


def last_report() -> Any:
    """The report of this process's last ``ferry.torch.save`` (a SaveReport: bytes, seconds,
    routes, fsyncs) or ``ferry.torch.load`` (a LoadReport: bytes, seconds, routes)."""
    return _last[0]


def _untyped(t: Any) -> Any:
    """The untyped storage behind `t` (torch 1.13 has no Tensor.untyped_storage)."""
    get = getattr(t, "untyped_storage", None)
    return get() if get is not None else t.storage().untyped()


def _unsupported(path: str, value: Any, why: str = "") -> TypeError:
    return TypeError(f"ferry.torch.save: {path} is a {type(value)}{why}: ferry.torch.save writes "
                     f"tensors and plain containers (dict, OrderedDict, list, tuple, str, int, "
                     f"float, bool, None); use torch.save")


class _StorageRef:
    """A storage in the pickle: persistent_id turns it into torch.save's storage tuple."""

    def __init__(self, key: str, dtype: Any, location: str, numel: int) -> None:
        self.pid = ("storage", getattr(torch, _STORAGE_CLASS[dtype]), key, location, numel)


class _Saver:
    """The walk of a save: refuses what stock torch.load(weights_only=True) would not rebuild,
    naming its key path, and numbers the storages (one per block of memory, as torch.save)."""

    def __init__(self) -> None:
        # (device, address) -> (key, dtype, nbytes, data pointer, first path)
        self.storages: Dict[Tuple[str, int], Tuple[str, Any, int, int, str]] = {}
        self.keep: List[Any] = []

    def walk(self, value: Any, path: str) -> None:
        kind = type(value)
        if kind in _PLAIN:
            return
        if kind in (dict, OrderedDict):
            for k, v in value.items():
                if type(k) is tuple:
                    self.walk(k, f"a key of {path}")
                elif type(k) not in _PLAIN:
                    raise _unsupported(f"a key of {path}", k)
                self.walk(v, f"{path}[{k!r}]")
            return
        if kind in (list, tuple, torch.Size):
            for i, v in enumerate(value):
                self.walk(v, f"{path}[{i}]")
            return
        if kind in (torch.Tensor, torch.nn.Parameter):
            self.tensor(value, path)
            return
        raise _unsupported(path, value)

    def tensor(self, t: Any, path: str) -> None:
        if t.layout != torch.strided:
            raise _unsupported(path, t, f" of layout {t.layout}")
        if t.dtype not in _STORAGE_CLASS:
            raise _unsupported(path, t, f" of dtype {t.dtype}")
        if t.device.type not in ("cpu", "cuda"):
            raise _unsupported(path, t, f" on {t.device}")
        ptr, nbytes = _storage(t)
        self.keep.append(t)
        if not ptr:
            return  # an empty storage: reduce() gives it a record of its own
        ident = (str(t.device), ptr)
        known = self.storages.get(ident)
        if known is None:
            self.storages[ident] = (str(len(self.storages)), t.dtype, nbytes, ptr, path)
        elif known[1] != t.dtype:
            raise TypeError(f"ferry.torch.save: {path} ({t.dtype}) and {known[4]} ({known[1]}) "
                            f"view one storage as different types, which torch.save refuses too")

    def reduce(self, t: Any) -> Any:
        """torch.save's reduction of a tensor: _rebuild_tensor_v2 or _rebuild_parameter."""
        if type(t) is torch.nn.Parameter:
            return (torch._utils._rebuild_parameter, (t.data, t.requires_grad, OrderedDict()))
        ptr, nbytes = _storage(t)
        ident = (str(t.device), ptr if ptr else -len(self.storages) - 1)  # empty: its own
        if ident not in self.storages:
            self.storages[ident] = (str(len(self.storages)), t.dtype, nbytes, ptr, "")
        key, dtype, nbytes, _, _ = self.storages[ident]
        location = "cpu" if t.device.type == "cpu" else f"cuda:{t.device.index}"
        ref = _StorageRef(key, dtype, location, nbytes // t.element_size())
        return (torch._utils._rebuild_tensor_v2,
                (ref, t.storage_offset(), tuple(t.size()), t.stride(), t.requires_grad,
                 OrderedDict()))

    def pickle(self, obj: Any) -> bytes:
        import io
        import pickle

        saver = self

        class Pickler(pickle.Pickler):
            def persistent_id(self, value: Any) -> Any:
                return value.pid if type(value) is _StorageRef else None

            def reducer_override(self, value: Any) -> Any:
                if type(value) in (torch.Tensor, torch.nn.Parameter):
                    return saver.reduce(value)
                return NotImplemented

        out = io.BytesIO()
        Pickler(out, protocol=2).dump(obj)
        return out.getvalue()


def save(obj: Any, f: Any, *, alignment: int = 4096, durable: bool = True,
         progress: Any = None, settings: Optional[Dict[str, str]] = None) -> Any:
    """``torch.save(obj, f)`` through ferry: the same zip, crash-safe and aligned.

    `obj`: what a training loop saves: nested dict, OrderedDict, list and tuple of tensors (CPU
    or CUDA; views and tied weights keep sharing their storage, as torch.save writes them), str,
    int, float, bool and None. Anything else raises TypeError naming its key path; torch.save
    takes it. `f`: a path (str or os.PathLike); a file object is handed to ``torch.save`` after
    the same check (no alignment, no fsync: the object's owner decides). `alignment`: where each
    storage of at least that many bytes starts (a power of two from 64 to 32768; torch's own is
    64). `durable=False` skips the fsyncs (the rename still makes the file appear whole).
    `progress`: as ``ferry.save_file``'s. Returns the SaveReport (also ``last_report()``).
    The tensors must not change until this returns."""
    saver = _Saver()
    saver.walk(obj, "obj")
    if not isinstance(f, (str, bytes, os.PathLike)):
        if not hasattr(f, "write"):
            raise TypeError(f"ferry.torch.save: f must be a path or a file object, not {type(f)}")
        torch.save(obj, f)
        return None
    data_pkl = saver.pickle(obj)
    rows = [(key, ptr, nbytes) for key, _, nbytes, ptr, _ in saver.storages.values()]
    _streams.wait_for_torch(saver.keep)
    _progress.check(progress)
    callback = _progress.reporter(progress, "saving")
    try:
        report = _ferry.torch_save_file(data_pkl, rows, _path_arg(f), alignment, durable,
                                        dict(settings or {}), progress=callback)
    finally:
        _progress.close(callback)
    _last[0] = report
    return report


class _Storage:
    """A storage of a load: `untyped`, over `buffer` (a uint8 tensor on its device, read after
    the walk) or, mapped (no buffer), a slice of the file's mapping."""

    def __init__(self, key: str, dtype: Any, buffer: Any, untyped: Any) -> None:
        self.key = key
        self.dtype = dtype
        self.buffer = buffer
        self.untyped = untyped


class _Loader:
    """The objects of a load: storages allocated on their device when data.pkl names them, read
    once each after the walk; tensors made over them as _rebuild_tensor_v2 says."""

    def __init__(self, path: str, map_location: Any, mmap: bool) -> None:
        self.path = path
        self.map_location = map_location
        self.mmap = mmap
        self.records: Dict[str, Tuple[int, int]] = {}
        self.storages: Dict[str, _Storage] = {}
        self.mapping: Any = None

    def fail(self, why: str) -> Exception:
        error = CheckpointError(f"ferry.torch.load {self.path}: {why}")
        error.filename = self.path
        return error

    def device(self, location: str) -> Any:
        where = self.map_location
        if isinstance(where, dict):
            where = where.get(location, location)
        if where is None:
            where = location
        if callable(where):
            raise TypeError("ferry.torch.load: a callable map_location is not supported; pass a "
                            "device, a str or a dict, or use torch.load")
        device = torch.device(where)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise self.fail(f"a storage saved on {location} goes to {device}, and CUDA is not "
                            f"available here; pass map_location='cpu'")
        return device

    def storage(self, pid: Any) -> _Storage:
        if (not isinstance(pid, tuple) or len(pid) != 5 or pid[0] != "storage"
                or not isinstance(pid[1], _Class) or pid[1].name not in _DTYPE_OF_CLASS):
            raise self.fail(f"a persistent id that is not torch.save's storage tuple: {pid!r}")
        _, cls, key, location, numel = pid
        if key in self.storages:
            return self.storages[key]
        dtype = _DTYPE_OF_CLASS[cls.name]
        record = self.records.get(key)
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        if record is None or record[1] != nbytes:
            raise self.fail(f"storage {key!r} ({cls.name} of {numel} elements) has " +
                            (f"no record data/{key}" if record is None else
                             f"a record of {record[1]} B, not {nbytes}"))
        device = self.device(str(location))
        if self.mmap:
            if device.type != "cpu":
                raise ValueError(f"ferry.torch.load: mmap=True maps {self.path} into host "
                                 f"memory; map_location {device} needs mmap=False")
            if self.mapping is None:
                self.mapping = _mapped(self.path)
            storage = _Storage(key, dtype, None, self.mapping[record[0]:record[0] + nbytes])
        else:
            buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
            storage = _Storage(key, dtype, buffer, _untyped(buffer))
        self.storages[key] = storage
        return storage

    def tensor(self, args: Any) -> Any:
        storage, offset, size, stride, requires_grad = args[:5]
        if not isinstance(storage, _Storage):
            raise self.fail(f"_rebuild_tensor_v2 of {storage!r}, not a storage")
        t = torch.empty(0, dtype=storage.dtype,
                        device=storage.buffer.device if storage.buffer is not None else "cpu")
        t.set_(storage.untyped, offset, tuple(size), tuple(stride))
        if requires_grad:
            t.requires_grad_(True)
        return t

    def build(self, kind: str, name: str, args: Any, state: Any, items: Any) -> Any:
        if kind == "storages":
            self.records = args
            return None
        if kind == "class":
            return _Class(name)
        if kind == "persistent":
            return self.storage(args)
        if name == "collections.OrderedDict" and (state is None or isinstance(state, dict)):
            out = OrderedDict(items or [])
            for k, v in (state or {}).items():  # a module's state_dict: its _metadata
                setattr(out, str(k), v)
            return out
        if state is not None:
            raise self.fail(f"{name} with a BUILD state, which a state dict never has")
        if name == "torch._utils._rebuild_tensor_v2" and len(args) >= 5:
            return self.tensor(args)
        if name == "torch._utils._rebuild_parameter" and len(args) >= 2:
            return torch.nn.Parameter(args[0], args[1])
        if name == "torch.Size" and len(args) == 1:
            return torch.Size(args[0])
        raise self.fail(f"calls {name}{args!r}, which a torch.save file of tensors never does")

    def read(self, settings: Dict[str, str]) -> Any:
        ranges = [(self.records[s.key][0], s.buffer.numel(), s.buffer.data_ptr())
                  for s in self.storages.values() if s.buffer is not None]
        for device in {s.buffer.device for s in self.storages.values() if s.buffer is not None}:
            if device.type == "cuda":
                _streams.settle_torch(device)
        return _ferry.torch_read(_path_arg(self.path), ranges, settings)


class _Class:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _mapped(path: str) -> Any:
    """The whole file as one untyped storage over a private mapping (MAP_PRIVATE), which each
    storage is a slice of, as torch.load(mmap=True) makes them."""
    size = os.path.getsize(path)
    untyped = torch.UntypedStorage
    return untyped.from_file(path, False, size)  # torch 1.13 takes no keywords


def load(f: Any, map_location: Any = None, weights_only: bool = True, mmap: bool = False, *,
         settings: Optional[Dict[str, str]] = None) -> Any:
    """``torch.load(f, map_location, weights_only=True, mmap)`` through ferry, for ferry's and
    stock ``torch.save`` files (the zip format of torch 1.6 and later).

    data.pkl is read by ferry's restricted unpickler: only tensors, parameters, their storages,
    OrderedDict and torch.Size may appear, besides plain values; any other class is refused
    (CheckpointError naming the file, the offset and the class) before anything runs. Each storage
    is allocated once on its device and read by ferry's gathered reads (storages shared by views
    stay shared). `map_location`: None (where each storage was saved), a device or its str, or a
    dict from saved location to device. `mmap=True`: tensors over a private mapping of the file
    (CPU only). `weights_only=False` hands the file to ``torch.load`` unchanged (it may run the
    pickle's code: torch's contract, not ferry's); so does a file object. The LoadReport is
    ``last_report()``."""
    if not weights_only or not isinstance(f, (str, bytes, os.PathLike)):
        kwargs: Dict[str, Any] = {"map_location": map_location, "weights_only": weights_only}
        if mmap:
            kwargs["mmap"] = mmap
        return torch.load(f, **kwargs)
    path = os.fsdecode(os.fspath(f))
    loader = _Loader(path, map_location, mmap)
    try:
        obj, _ = _ferry.torch_open(_path_arg(path), loader.build)
    except CheckpointError as e:  # the C++ error names formats by extension: say which this is
        prefix = f"safetensors {path}: "
        if not str(e).startswith(prefix):
            raise
        raise loader.fail(str(e)[len(prefix):]) from None
    _last[0] = loader.read(dict(settings or {}))
    return obj


