"""transformers' own ``from_pretrained`` with the safetensors bytes read by ferry:

    import ferry.transformers
    ferry.transformers.enable()      # or: with ferry.transformers.loading(): ...
    model = AutoModelForCausalLM.from_pretrained("/models/qwen", device_map="cuda:0")
    print(ferry.transformers.last_load_report())

transformers 5 loads a checkpoint in ``PreTrainedModel._load_pretrained_model(model, state_dict,
checkpoint_files, load_config)``: it opens each shard with ``safe_open`` (the name imported into
``transformers.modeling_utils``), takes a lazy slice of every tensor, and materialises each slice
(``slice[...]``, then ``.to(device, dtype)``) before renaming keys, converting weights, casting,
tying and initialising what is missing. ferry changes only where those bytes come from: when a
load is one it can serve (local safetensors files, one CPU or CUDA device, no quantizer, no tensor
parallelism), the first ``safe_open`` of the load reads every shard through ferry straight into the
target device, and each slice hands transformers that tensor; everything after the read is
transformers' own code, so the model comes out as stock's. A load ferry cannot serve runs stock,
and ``last_load_report()`` says why, file by file.

The patch is process-wide while enabled; the choice of files is per load and per thread.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .checkpoint import _DTYPES, _PACKED, Checkpoint

# The leading parameters of the seam, as transformers 5 names them.
_SEAM_PARAMS = ("model", "state_dict", "checkpoint_files", "load_config")
# Shards read at once (each one is already spread over ferry's workers).
_FILES_AT_ONCE = 4


@dataclass
class FileReport:
    """One checkpoint file of a load: which path read it and why, its bytes and speed, and for
    ferry's path the route its bytes took (a LoadReport summary)."""

    path: str
    taken: str  # "ferry" or "stock"
    reason: str
    bytes: int = 0
    seconds: Optional[float] = None
    route: str = ""

    @property
    def gbps(self) -> Optional[float]:
        if not self.seconds:
            return None
        return self.bytes / self.seconds / 1e9


@dataclass
class TransformersLoadReport:
    """One ``_load_pretrained_model`` call: the device it loaded onto, each file's report, the
    wall time of ferry's reads and of the whole weight load (reads plus transformers' key
    renaming, conversion, casting and placement)."""

    model: str
    device: str
    files: List[FileReport] = field(default_factory=list)
    read_seconds: float = 0.0
    load_seconds: float = 0.0

    @property
    def taken(self) -> str:
        kinds = {f.taken for f in self.files}
        return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "stock")

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_dict(self) -> Dict[str, Any]:
        return {"model": self.model, "device": self.device, "taken": self.taken,
                "bytes": self.bytes, "read_seconds": self.read_seconds,
                "load_seconds": self.load_seconds,
                "files": [dict(vars(f), gbps=f.gbps) for f in self.files]}

    def __str__(self) -> str:
        lines = [f"{self.model} -> {self.device}: {self.taken}, {self.bytes} bytes, reads "
                 f"{self.read_seconds:.3f} s, weight load {self.load_seconds:.3f} s"]
        for f in self.files:
            speed = f" {f.seconds:.3f} s {f.gbps:.2f} GB/s" if f.seconds else ""
            lines.append(f"  {f.taken:5} {os.path.basename(f.path)} {f.bytes} B{speed}: {f.reason}")
            if f.route:
                lines.append(f"        {f.route}")
        return "\n".join(lines)


_last: List[Optional[TransformersLoadReport]] = [None]


def last_load_report() -> Optional[TransformersLoadReport]:
    """The report of this process's most recent transformers weight load made while ferry's
    patch was installed, or None."""
    return _last[0]


# --------------------------------------------------------------------------------- decisions


def _device_name(value: Any) -> Tuple[Optional[str], str]:
    """("cpu" | "cuda:N", "") for a device_map value ferry can read into, else (None, reason)."""
    if isinstance(value, str) and value in ("disk", "meta"):
        return None, f"device_map places weights on '{value}'"
    try:
        import torch
        device = torch.device(f"cuda:{value}" if isinstance(value, int) else value)
    except (RuntimeError, TypeError, ValueError) as e:
        return None, f"device_map value {value!r} is not a torch device ({e})"
    if device.type == "cpu":
        return "cpu", ""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index}", ""
    return None, f"device {device}: ferry reads into host or CUDA memory only"


def decide(state_dict: Any, checkpoint_files: Optional[Sequence[str]], load_config: Any,
           deepspeed_zero3: bool = False,
           on_hf_mount: Optional[Callable[[str], bool]] = None) -> Tuple[Optional[str], str]:
    """Whether ferry can read this load: (device, "") or (None, why stock reads it). Cheapest
    facts first; every refusal names what it saw."""
    if state_dict is not None:
        return None, "the caller gave a state_dict (or a GGUF file was converted into one)"
    if not checkpoint_files:
        return None, "transformers found no checkpoint files"
    pickles = [f for f in checkpoint_files if not str(f).endswith(".safetensors")]
    if pickles:
        return None, f"{os.path.basename(str(pickles[0]))} is not safetensors (torch.load reads it)"
    if getattr(load_config, "hf_quantizer", None) is not None:
        return None, "quantized model: the quantizer reads and converts the tensors"
    if getattr(load_config, "device_mesh", None) is not None:
        return None, "tensor parallelism: the device mesh shards tensors as they are read"
    if deepspeed_zero3:
        return None, "DeepSpeed ZeRO-3 partitions the weights as they load"
    if getattr(load_config, "disable_mmap", None):
        return None, "disable_mmap=True: transformers reads whole files itself"
    if not hasattr(load_config, "device_map"):
        return None, f"transformers' {type(load_config).__name__} has no device_map"
    device_map = load_config.device_map
    values = list(device_map.values()) if isinstance(device_map, dict) else [device_map]
    devices = set()
    for value in values:
        name, why = ("cpu", "") if value is None else _device_name(value)
        if name is None:
            return None, why
        devices.add(name)
    if len(devices) > 1:
        return None, f"device_map spans {', '.join(sorted(devices))}: accelerate dispatches it"
    for f in checkpoint_files:
        if not os.path.isfile(f):
            return None, f"{f} is not a local file"
        if on_hf_mount is not None and on_hf_mount(f):
            return None, f"{f} is on an hf-mount file system: transformers reads it whole"
    return devices.pop(), ""


# --------------------------------------------------------------------------------- reading


class _Slice:
    """What ``safe_open(...).get_slice(name)`` gives transformers: the shape and dtype from the
    header, and on the first ``[...]`` the tensor ferry read (handed over, so a cast copy does not
    keep the original alive); a second access reads the tensor again."""

    __slots__ = ("_handle", "_name")

    def __init__(self, handle: "_Handle", name: str) -> None:
        self._handle, self._name = handle, name

    def get_shape(self) -> List[int]:
        return list(self._handle.ckpt.entry(self._name).shape)

    def get_dtype(self) -> str:
        return str(self._handle.ckpt.entry(self._name).dtype)

    def __getitem__(self, index: Any) -> Any:
        return self._handle.take(self._name)[index]


class _Handle:
    """A shard for transformers, in the shape of a safetensors ``safe_open`` handle: the tensors
    ferry read up front, or (``on_demand``) each read when transformers materialises it."""

    def __init__(self, ckpt: Checkpoint, tensors: Dict[str, Any], device: str,
                 report: FileReport, on_demand: bool = False) -> None:
        self.ckpt, self.tensors, self.device = ckpt, tensors, device
        self.report, self.on_demand = report, on_demand
        self.lock = threading.Lock()

    def __enter__(self) -> "_Handle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.tensors = {}

    def keys(self) -> List[str]:
        return list(self.ckpt.entries)

    def offset_keys(self) -> List[str]:
        return list(self.ckpt.entries)

    def metadata(self) -> Optional[Dict[str, str]]:
        return self.ckpt.metadata(0) or None

    def take(self, name: str) -> Any:
        tensor = self.tensors.pop(name, None)
        if tensor is not None:
            return tensor
        start = time.perf_counter()
        tensor = self.ckpt.load("pt", self.device, names=[name])[name]
        if self.on_demand:
            with self.lock:
                self.report.bytes += self.ckpt.entry(name).nbytes
                self.report.seconds = (self.report.seconds or 0.0) + time.perf_counter() - start
        return tensor

    def get_tensor(self, name: str) -> Any:
        return self.take(name)

    def get_slice(self, name: str) -> _Slice:
        self.ckpt.entry(name)  # raises for a name the file lacks, as safetensors does
        return _Slice(self, name)


# The floating-point kinds a cast can shrink.
_CAST = ("F64", "F32", "F16", "BF16")


_ON_DEMAND = "on demand: one gathered request per tensor"


def _shrinking_cast(ckpts: Sequence[Checkpoint], dtype: Any) -> bool:
    """Whether casting the checkpoint to `dtype` makes some tensor smaller (an F32 checkpoint
    loaded as bf16): then reading it all up front would hold both copies at once."""
    if not getattr(dtype, "is_floating_point", False):
        return False
    import torch
    itemsize = torch.empty((), dtype=dtype).element_size()
    return any(e.dtype in _CAST and _DTYPES[e.dtype].bits // 8 > itemsize
               for c in ckpts for e in c.entries.values())


class _ServedFiles:
    """The files of one load that ferry serves. On the first ``safe_open`` of any of them, every
    header is opened; then all the tensors are read at once into the target device, or, where
    transformers' cast shrinks them, each is read when transformers materialises it, so the
    uncast copy lives only until its cast (peak memory as stock's)."""

    def __init__(self, files: Sequence[str], device: str, report: TransformersLoadReport,
                 dtype: Any = None) -> None:
        self.device, self.report, self.dtype = device, report, dtype
        self.files = {os.path.realpath(f): FileReport(os.fspath(f), "stock", "", _size(f))
                      for f in files}
        self.handles: Optional[Dict[str, Optional[_Handle]]] = None

    def serves(self, filename: Any) -> bool:
        try:
            return os.path.realpath(os.fspath(filename)) in self.files
        except TypeError:
            return False

    def handle(self, filename: Any) -> Optional[_Handle]:
        """ferry's handle for `filename`, or None where ferry could not read it."""
        if self.handles is None:
            self._read_all()
        assert self.handles is not None
        return self.handles.pop(os.path.realpath(os.fspath(filename)), None)

    def _open(self, key: str) -> Optional[Checkpoint]:
        entry = self.files[key]
        try:
            ckpt = Checkpoint(entry.path)
        except Exception as e:  # noqa: BLE001 - any failure hands the file to stock, with why
            entry.reason = f"ferry could not open it, so stock read it: {e}"
            return None
        packed = [e for e in ckpt.entries.values() if e.dtype in _PACKED]
        if packed:
            entry.reason = (f"tensor '{packed[0].name}' is {packed[0].dtype}, which ferry gives "
                            f"as raw bytes and safetensors as a typed tensor")
            return None
        return ckpt

    def _read_one(self, key: str, ckpt: Checkpoint) -> Optional[_Handle]:
        entry = self.files[key]
        start = time.perf_counter()
        try:
            tensors = ckpt.load("pt", self.device)
        except Exception as e:  # noqa: BLE001 - any failure hands the file to stock, with why
            entry.reason = f"ferry could not read it, so stock did: {e}"
            return None
        entry.taken, entry.seconds = "ferry", time.perf_counter() - start
        entry.reason = f"read by ferry into {self.device}"
        if ckpt.last_report is not None:
            entry.bytes = ckpt.last_report.bytes
            entry.route = ckpt.last_report.summary()
        return _Handle(ckpt, tensors, self.device, entry)

    def _read_all(self) -> None:
        start = time.perf_counter()
        keys = list(self.files)
        ckpts = {k: c for k, c in zip(keys, map(self._open, keys)) if c is not None}
        self.handles = dict.fromkeys(keys)
        if _shrinking_cast(list(ckpts.values()), self.dtype):
            for key, ckpt in ckpts.items():
                entry = self.files[key]
                entry.taken, entry.bytes, entry.seconds, entry.route = "ferry", 0, 0.0, _ON_DEMAND
                entry.reason = (f"read by ferry into {self.device} tensor by tensor as "
                                f"transformers casts each to {self.dtype} (the cast shrinks them)")
                self.handles[key] = _Handle(ckpt, {}, self.device, entry, on_demand=True)
            return
        with ThreadPoolExecutor(max_workers=max(1, min(_FILES_AT_ONCE, len(ckpts))),
                                thread_name_prefix="ferry-hf") as pool:
            read = list(pool.map(self._read_one, ckpts.keys(), ckpts.values()))
        self.handles.update(zip(ckpts.keys(), read))
        self.report.read_seconds = time.perf_counter() - start

    def finish(self) -> None:
        for key, unopened in (self.handles or {}).items():
            if unopened is not None:
                self.files[key].reason += " (read, but transformers never opened it)"
        for entry in self.files.values():
            if entry.taken == "stock" and not entry.reason:
                entry.reason = ("transformers did not open it through modeling_utils.safe_open "
                                "(this transformers version loads it another way)")
        if any(f.route == _ON_DEMAND for f in self.files.values()):
            self.report.read_seconds = sum(f.seconds or 0.0 for f in self.files.values())
        self.report.files = list(self.files.values())
        self.handles = None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# --------------------------------------------------------------------------------- the patch


class _Patch:
    """The installed seam: the original ``_load_pretrained_model`` and ``safe_open``, and who
    holds the patch (``enable()`` and each ``loading()`` block)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.enabled = False
        self.module: Any = None
        self.original_load: Any = None
        self.original_safe_open: Any = None
        self.local = threading.local()


_patch = _Patch()


def _seam(module: Any) -> str:
    """Why `module` (transformers.modeling_utils) lacks the seam ferry patches, or ""."""
    model_class = getattr(module, "PreTrainedModel", None)
    if model_class is None or not hasattr(module, "safe_open"):
        return "transformers.modeling_utils has no PreTrainedModel or safe_open"
    load = inspect.getattr_static(model_class, "_load_pretrained_model", None)
    if not isinstance(load, staticmethod):
        return "PreTrainedModel._load_pretrained_model is not a staticmethod"
    names = list(inspect.signature(load.__func__).parameters)[:len(_SEAM_PARAMS)]
    if tuple(names) != _SEAM_PARAMS:
        return (f"PreTrainedModel._load_pretrained_model takes ({', '.join(names)}), not "
                f"({', '.join(_SEAM_PARAMS)}) as transformers 5 does")
    return ""


def _ferry_safe_open(*args: Any, **kwargs: Any) -> Any:
    """transformers' ``safe_open`` while the patch is installed: ferry's handle for a file of the
    load this thread is running, if ferry serves it; safetensors' own otherwise."""
    served: Optional[_ServedFiles] = getattr(_patch.local, "served", None)
    filename = args[0] if args else kwargs.get("filename")
    framework = args[1] if len(args) > 1 else kwargs.get("framework", "pt")
    if served is not None and framework in ("pt", "torch") and served.serves(filename):
        handle = served.handle(filename)
        if handle is not None:
            return handle
    return _patch.original_safe_open(*args, **kwargs)


def _ferry_load_pretrained_model(model: Any, state_dict: Any, checkpoint_files: Any,
                                 load_config: Any, *args: Any, **kwargs: Any) -> Any:
    """``PreTrainedModel._load_pretrained_model`` while the patch is installed: decides whether
    ferry reads this load's files, then runs transformers' own."""
    module = _patch.module
    original = _patch.original_load.__func__
    zero3 = getattr(module, "is_deepspeed_zero3_enabled", None)
    device, why = decide(state_dict, checkpoint_files, load_config,
                         deepspeed_zero3=bool(zero3 and zero3()),
                         on_hf_mount=getattr(module, "_is_on_hf_mount", None))
    name = type(model).__name__
    report = TransformersLoadReport(name, device or "-")
    start = time.perf_counter()
    if device is None:
        report.files = [FileReport(os.fspath(f), "stock", why, _size(f))
                        for f in (checkpoint_files or [])]
        try:
            return original(model, state_dict, checkpoint_files, load_config, *args, **kwargs)
        finally:
            report.load_seconds = time.perf_counter() - start
            _last[0] = report
    served = _ServedFiles(checkpoint_files, device, report, getattr(load_config, "dtype", None))
    outer = getattr(_patch.local, "served", None)
    _patch.local.served = served
    try:
        return original(model, state_dict, checkpoint_files, load_config, *args, **kwargs)
    finally:
        _patch.local.served = outer
        served.finish()
        report.load_seconds = time.perf_counter() - start
        _last[0] = report


def _install() -> None:
    """Installs the patch unless it is in; where this transformers lacks the seam, warns and
    leaves transformers as it is (its loads stay stock)."""
    if _patch.module is not None:
        return
    import transformers.modeling_utils as module  # type: ignore[import]
    why = _seam(module)
    if why:
        warnings.warn(f"ferry.transformers: transformers {_transformers_version()} is left stock: "
                      f"{why}", RuntimeWarning, stacklevel=4)
        return
    _patch.module = module
    _patch.original_load = inspect.getattr_static(module.PreTrainedModel,
                                                  "_load_pretrained_model")
    _patch.original_safe_open = module.safe_open
    module.PreTrainedModel._load_pretrained_model = staticmethod(_ferry_load_pretrained_model)
    module.safe_open = _ferry_safe_open


def _uninstall() -> None:
    module = _patch.module
    if module is None:
        return
    module.PreTrainedModel._load_pretrained_model = _patch.original_load
    module.safe_open = _patch.original_safe_open
    _patch.module = _patch.original_load = _patch.original_safe_open = None


def _transformers_version() -> str:
    try:
        import transformers
        return str(getattr(transformers, "__version__", "?"))
    except ImportError:
        return "(not installed)"


def _acquire() -> None:
    with _patch.lock:
        _install()
        _patch.users += 1


def _release() -> None:
    with _patch.lock:
        _patch.users -= 1
        if _patch.users == 0 and not _patch.enabled:
            _uninstall()


def enable() -> bool:
    """Make every ``from_pretrained`` of this process read safetensors weights through ferry
    (where it can; the rest stays stock, with the reason in ``last_load_report()``). False, with
    a RuntimeWarning saying why, where this transformers lacks the seam ferry patches."""
    with _patch.lock:
        _install()
        _patch.enabled = True
        return _patch.module is not None


def disable() -> None:
    """Undo ``enable()``: transformers' own functions are back once no ``loading()`` block
    is open."""
    with _patch.lock:
        if _patch.users == 0:
            _uninstall()
        _patch.enabled = False


def is_enabled() -> bool:
    """Whether ferry's patch is installed now (by ``enable()`` or an open ``loading()``)."""
    return _patch.module is not None


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Inside the block, ``from_pretrained`` reads safetensors weights through ferry."""
    _acquire()
    try:
        yield
    finally:
        _release()


def from_pretrained(model_class: Any, pretrained_model_name_or_path: Any, *args: Any,
                    **kwargs: Any) -> Any:
    """``model_class.from_pretrained(path, ...)`` (an ``AutoModel*`` class or a model class)
    with the weights read through ferry."""
    with loading():
        return model_class.from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


__all__ = ["FileReport", "TransformersLoadReport", "decide", "disable", "enable",
           "from_pretrained", "is_enabled", "last_load_report", "loading"]
