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
load is one it can serve (local safetensors files, one CPU or CUDA device, no quantizer), ferry
reads every shard straight into the target device, and each slice hands transformers that tensor;
everything after the read is transformers' own code, so the model comes out as stock's. A load
ferry cannot serve runs stock, and ``last_load_report()`` says why, file by file.

Under tensor parallelism (``tp_plan``, a device mesh), transformers cuts each rank's part out of
every lazy slice (``slice[start:stop]`` on the split dimension, lists of rows for fused gate-up
blocks, ``slice[...]`` for what it replicates). There ferry reads nothing up front: its slice
reads, for each index transformers gives, only the bytes of that rank's part, into the device
``safe_open`` was asked for, so the rank's shards are stock's by construction and each rank reads
about its share of the checkpoint.

The reads start early: ``from_pretrained`` knows the files and the dtype (``_get_dtype``) before it
builds the model, so there ferry starts reading in a thread, and the model's construction and
transformers' lazy imports run under the reads. ``_load_pretrained_model`` then decides again from
its full arguments; where that decision differs (the device, the files), the early reads are
dropped, with the reason in the report. A ``from_pretrained`` that raises before it takes the
tensors waits for the reads and frees them.

The patch is process-wide while enabled; the choice of files is per load and per thread.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time
import types
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ._weights import read_index
from .checkpoint import _DTYPES, _PACKED, Checkpoint, _framework

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
    # How the reads started: before the model was built, or why not.
    early: str = ""
    # Seconds from the from_pretrained call to ferry's first read, and to transformers asking for
    # the weights (the model built); None outside from_pretrained or without an early start.
    read_started_s: Optional[float] = None
    model_built_s: Optional[float] = None
    # Seconds transformers waited at its first safe_open for reads still running.
    waited_seconds: float = 0.0

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
                "load_seconds": self.load_seconds, "early": self.early,
                "read_started_s": self.read_started_s, "model_built_s": self.model_built_s,
                "waited_seconds": self.waited_seconds,
                "files": [dict(vars(f), gbps=f.gbps) for f in self.files]}

    def __str__(self) -> str:
        lines = [f"{self.model} -> {self.device}: {self.taken}, {self.bytes} bytes, reads "
                 f"{self.read_seconds:.3f} s, weight load {self.load_seconds:.3f} s"]
        if self.early:
            lines.append(f"  reads {self.early}")
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


# decide's device for a tensor-parallel load: each slice reads the rank's part when indexed.
SLICES = "per-rank slices"


def _mesh_words(mesh: Any) -> str:
    """"rank R of N" for a torch DeviceMesh, or what it is where it is not one."""
    try:
        return f"rank {mesh.get_rank()} of {mesh.size()}"
    except Exception:  # noqa: BLE001 - a mesh of another shape: the report says what it was
        return f"device mesh {type(mesh).__name__}"


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
    """Whether ferry can read this load: (device, "") or (None, why stock reads it); under tensor
    parallelism (a device mesh) the device is ``SLICES``. Cheapest facts first; every refusal
    names what it saw."""
    if state_dict is not None:
        return None, "the caller gave a state_dict (or a GGUF file was converted into one)"
    if not checkpoint_files:
        return None, "transformers found no checkpoint files"
    pickles = [f for f in checkpoint_files if not str(f).endswith(".safetensors")]
    if pickles:
        return None, f"{os.path.basename(str(pickles[0]))} is not safetensors (torch.load reads it)"
    if getattr(load_config, "hf_quantizer", None) is not None:
        return None, "quantized model: the quantizer reads and converts the tensors"
    if deepspeed_zero3:
        return None, "DeepSpeed ZeRO-3 partitions the weights as they load"
    if getattr(load_config, "disable_mmap", None):
        return None, "disable_mmap=True: transformers reads whole files itself"
    if getattr(load_config, "device_mesh", None) is not None:
        device, why = SLICES, ""
    elif not hasattr(load_config, "device_map"):
        return None, f"transformers' {type(load_config).__name__} has no device_map"
    else:
        device, why = _one_device(load_config.device_map)
    if device is None:
        return None, why
    for f in checkpoint_files:
        if not os.path.isfile(f):
            return None, f"{f} is not a local file"
        if on_hf_mount is not None and on_hf_mount(f):
            return None, f"{f} is on an hf-mount file system: transformers reads it whole"
    return device, ""


def _one_device(device_map: Any) -> Tuple[Optional[str], str]:
    """The one device a device_map (None, a device, or a dict of them) puts every weight on."""
    values = list(device_map.values()) if isinstance(device_map, dict) else [device_map]
    devices = set()
    for value in values:
        name, why = ("cpu", "") if value is None else _device_name(value)
        if name is None:
            return None, why
        devices.add(name)
    if len(devices) > 1:
        return None, f"device_map spans {', '.join(sorted(devices))}: accelerate dispatches it"
    return devices.pop(), ""


# --------------------------------------------------------------------------------- reading


class _Slice:
    """What ``safe_open(...).get_slice(name)`` gives transformers: the shape and dtype from the
    header, and on the first ``[...]`` the tensor ferry read (handed over, so a cast copy does not
    keep the original alive); a second access, or one of a handle that reads on demand, reads
    only the bytes the index asks for (a tensor-parallel rank's part)."""

    __slots__ = ("_handle", "_name")

    def __init__(self, handle: "_Handle", name: str) -> None:
        self._handle, self._name = handle, name

    def get_shape(self) -> List[int]:
        return list(self._handle.ckpt.entry(self._name).shape)

    def get_dtype(self) -> str:
        return str(self._handle.ckpt.entry(self._name).dtype)

    def __getitem__(self, index: Any) -> Any:
        return self._handle.take(self._name, index)


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

    def take(self, name: str, index: Any = Ellipsis) -> Any:
        """``tensor[index]``: of the tensor read up front (handed over), else read now, only the
        bytes of `index`'s box where it picks a part."""
        tensor = self.tensors.pop(name, None)
        if tensor is not None:
            return tensor[index]
        start = time.perf_counter()
        entry = self.ckpt.entry(name)
        if index is Ellipsis:
            tensor, nbytes = self.ckpt.load("pt", self.device, names=[name])[name], entry.nbytes
        else:
            tensor, nbytes = read_index(self.ckpt, _framework("pt", self.device), entry, index)
            tensor = tensor.contiguous()  # as safetensors' slices are
        if self.on_demand:
            with self.lock:
                self.report.bytes += nbytes
                self.report.seconds = (self.report.seconds or 0.0) + time.perf_counter() - start
        return tensor

    def get_tensor(self, name: str) -> Any:
        return self.take(name)

    def get_slice(self, name: str) -> _Slice:
        self.ckpt.entry(name)  # raises for a name the file lacks, as safetensors does
        return _Slice(self, name)


_ON_DEMAND = "on demand: one gathered request per tensor"
_SLICED = "on demand: one gathered request per slice transformers takes"


def _shrinking_cast(ckpts: Sequence[Checkpoint], dtype: Any) -> bool:
    """Whether casting the checkpoint to `dtype` makes some tensor smaller (an F32 checkpoint
    loaded as bf16): then reading it all up front would hold both copies at once."""
    if not getattr(dtype, "is_floating_point", False):
        return False
    import torch
    itemsize = torch.empty((), dtype=dtype).element_size()
    return any(_DTYPES[e.dtype].convertible and _DTYPES[e.dtype].bits // 8 > itemsize
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
        self.thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None
        # Set once the reads are planned: whether they read everything up front.
        self.planned = threading.Event()
        self.up_front = False
        self.started_at: Optional[float] = None
        self.mesh = ""  # a tensor-parallel load's "rank R of N"

    def matches(self, files: Sequence[str], device: str, dtype: Any) -> str:
        """"" where this load wants what these reads read, else what differs."""
        wanted = {os.path.realpath(os.fspath(f)) for f in files}
        if wanted != set(self.files):
            return "transformers asked for other files"
        if device != self.device:
            return f"transformers placed the weights on {device}, not {self.device}"
        if dtype != self.dtype:
            return f"transformers settled on dtype {dtype}, not {self.dtype}"
        return ""

    def start(self) -> None:
        """Reads every file now, in a thread (ferry's loads release the GIL), so that transformers
        builds the model meanwhile; ``handle`` waits for it."""
        self.started_at = time.perf_counter()
        self.thread = threading.Thread(target=self._read_in_thread, name="ferry-hf-read",
                                       daemon=True)
        self.thread.start()

    def _read_in_thread(self) -> None:
        try:
            self._read_all()
        except BaseException as e:  # noqa: BLE001 - raised again in the thread that waits
            self.error = e
        finally:
            self.planned.set()

    def wait(self) -> None:
        """Waits for the reads ``start`` began; an error of that thread is raised here."""
        thread, self.thread = self.thread, None
        if thread is None:
            return
        start = time.perf_counter()
        thread.join()
        self.report.waited_seconds += time.perf_counter() - start
        error, self.error = self.error, None
        if error is not None:
            raise error

    def cancel(self) -> None:
        """Drops what was read (after the thread, which a read in C++ cannot leave midway)."""
        if self.thread is not None:
            self.thread.join()
            self.thread, self.error = None, None
        self.handles = None

    def serves(self, filename: Any) -> bool:
        try:
            return os.path.realpath(os.fspath(filename)) in self.files
        except TypeError:
            return False

    def handle(self, filename: Any, device: Any = "cpu") -> Optional[_Handle]:
        """ferry's handle for `filename`, or None where ferry could not read it. `device`: the
        one safe_open was asked for, where a tensor-parallel load's slices read into."""
        if self.device == SLICES:
            return self._sliced(os.path.realpath(os.fspath(filename)), device)
        self.wait()
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

    def _sliced(self, key: str, device: Any) -> Optional[_Handle]:
        """A tensor-parallel load's handle: nothing read up front; each slice reads the part
        transformers indexes, into `device`."""
        entry = self.files[key]
        device, why = _device_name(device)
        if device is None:
            entry.reason = f"safe_open was asked for it on another device: {why}"
            return None
        ckpt = self._open(key)
        if ckpt is None:
            return None
        entry.taken, entry.bytes, entry.seconds, entry.route = "ferry", 0, 0.0, _SLICED
        entry.reason = (f"{self.mesh}: read by ferry into {device}, only the part of each tensor "
                        f"transformers' tensor parallelism takes")
        return _Handle(ckpt, {}, device, entry, on_demand=True)

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
        self.up_front = not _shrinking_cast(list(ckpts.values()), self.dtype)
        self.planned.set()
        if not self.up_front:
            for key, ckpt in ckpts.items():
                entry = self.files[key]
                entry.taken, entry.bytes, entry.seconds, entry.route = "ferry", 0, 0.0, _ON_DEMAND
                entry.reason = (f"read by ferry into {self.device} tensor by tensor as "
                                f"transformers casts each to {self.dtype} (the cast shrinks them)")
                self.handles[key] = _Handle(ckpt, {}, self.device, entry, on_demand=True)
            return
        if self.started_at is not None and self.device.startswith("cuda"):
            _warm_allocator(self.device, sum(e.nbytes for c in ckpts.values()
                                             for e in c.entries.values()))
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
        if any(f.route in (_ON_DEMAND, _SLICED) for f in self.files.values()):
            self.report.read_seconds = sum(f.seconds or 0.0 for f in self.files.values())
        self.report.files = list(self.files.values())
        self.handles = None


def _warm_allocator(device: str, nbytes: int) -> None:
    """What transformers' ``caching_allocator_warmup`` does, which the early reads skip (they
    come first): one allocation of the whole model, freed into torch's cache, so that the tensors
    are cut from one segment instead of each costing a cudaMalloc. Peak memory stays the model's.
    Where it fails (no room for one piece), the reads allocate tensor by tensor, as without it."""
    import torch
    try:
        torch.empty(nbytes, dtype=torch.uint8, device=device)
    except Exception:  # noqa: BLE001 - out of memory, or a torch without CUDA: reads say why
        pass


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# --------------------------------------------------------------------------------- the patch


class _Patch:
    """The installed seam: the original ``_load_pretrained_model`` and ``safe_open``, where this
    transformers has them the originals of the early start (``from_pretrained``, ``_get_dtype``,
    ``caching_allocator_warmup``), and who holds the patch (``enable()`` and each ``loading()``
    block)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.enabled = False
        self.module: Any = None
        self.originals: Dict[str, Any] = {}
        self.no_early = ""  # why this transformers gives no early start, or ""
        self.local = threading.local()


class _Call:
    """One ``from_pretrained`` call while the patch is installed: its keyword arguments, its
    report, and the reads started for it before the model was built."""

    def __init__(self, model_class: Any, kwargs: Dict[str, Any]) -> None:
        self.kwargs = kwargs
        self.start = time.perf_counter()
        self.report = TransformersLoadReport(getattr(model_class, "__name__", "?"), "-")
        self.served: Optional[_ServedFiles] = None


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


# The leading parameters of _get_dtype, where from_pretrained knows the files and the dtype.
_GET_DTYPE_PARAMS = ("dtype", "checkpoint_files", "config", "sharded_metadata", "state_dict",
                     "weights_only", "hf_quantizer")


def _early_seam(module: Any) -> str:
    """Why `module` gives ferry no place to start reading before the model is built, or ""."""
    load = inspect.getattr_static(module.PreTrainedModel, "from_pretrained", None)
    if not isinstance(load, classmethod):
        return "PreTrainedModel.from_pretrained is not a classmethod"
    get_dtype = getattr(module, "_get_dtype", None)
    if get_dtype is None:
        return "transformers.modeling_utils has no _get_dtype"
    names = tuple(inspect.signature(get_dtype).parameters)[:len(_GET_DTYPE_PARAMS)]
    if names != _GET_DTYPE_PARAMS:
        return f"_get_dtype takes ({', '.join(names)}), not ({', '.join(_GET_DTYPE_PARAMS)})"
    return ""


# from_pretrained's arguments that shard the weights as they are read.
_PARALLEL_KWARGS = ("tp_plan", "tp_size", "device_mesh", "distributed_config")
# device_map values that accelerate resolves only once the model is built.
_PLANNED_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def _early_device(kwargs: Dict[str, Any], module: Any) -> Tuple[Optional[str], str]:
    """The device from_pretrained's own arguments put every weight on, before the model exists,
    or (None, why not)."""
    for key in _PARALLEL_KWARGS:
        if kwargs.get(key) is not None:
            return None, (f"{key}= asks for tensor parallelism: each rank reads its slices as "
                          f"transformers cuts them")
    device_map = kwargs.get("device_map")
    if device_map is None:
        probe = getattr(module, "get_torch_context_manager_or_global_device", None)
        device_map = probe() if probe is not None else None
    if isinstance(device_map, str) and device_map in _PLANNED_MAPS:
        return None, f"device_map={device_map!r} is planned only once the model is built"
    return _one_device(device_map)


def _start_early(call: _Call, args: Tuple[Any, ...], kwargs: Dict[str, Any], dtype: Any) -> None:
    """At ``_get_dtype``: starts reading `call`'s files where from_pretrained's arguments already
    settle that ferry serves them; else records why the reads wait for the seam."""
    module = _patch.module
    bound = inspect.signature(_patch.originals["_get_dtype"]).bind(*args, **kwargs).arguments
    device, why = _early_device(call.kwargs, module)
    if device is not None:
        zero3 = getattr(module, "is_deepspeed_zero3_enabled", None)
        config = types.SimpleNamespace(device_map={"": device}, device_mesh=None,
                                       hf_quantizer=bound.get("hf_quantizer"))
        device, why = decide(bound.get("state_dict"), bound.get("checkpoint_files"), config,
                             deepspeed_zero3=bool(zero3 and zero3()),
                             on_hf_mount=getattr(module, "_is_on_hf_mount", None))
    if device is None:
        call.report.early = f"started when transformers asked, not before: {why}"
        return
    call.served = _ServedFiles(bound["checkpoint_files"], device, call.report, dtype)
    call.report.read_started_s = time.perf_counter() - call.start
    call.report.early = "started before the model was built"
    call.served.start()


def _ferry_get_dtype(*args: Any, **kwargs: Any) -> Any:
    """transformers' ``_get_dtype`` while the patch is installed: the same, and then ferry's reads
    start (the files and the dtype are known; the model is not built yet)."""
    result = _patch.originals["_get_dtype"](*args, **kwargs)
    call: Optional[_Call] = getattr(_patch.local, "call", None)
    if call is not None and call.served is None and not call.report.early:
        _start_early(call, args, kwargs, result[1])
    return result


def _ferry_warmup(*args: Any, **kwargs: Any) -> Any:
    """transformers' ``caching_allocator_warmup``, skipped where ferry's reads, started before it,
    already hold the weights on the device (a warm-up then would reserve the model twice)."""
    served: Optional[_ServedFiles] = getattr(_patch.local, "served", None)
    if served is not None and served.thread is not None:
        served.planned.wait()
        if served.up_front:
            return None
    return _patch.originals["caching_allocator_warmup"](*args, **kwargs)


def _ferry_from_pretrained(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """``PreTrainedModel.from_pretrained`` while the patch is installed: transformers' own, with
    this call's arguments kept for the early start; reads it started and never handed over (the
    call raised first) are waited for and freed before it returns."""
    call = _Call(cls, kwargs)
    outer = getattr(_patch.local, "call", None)
    _patch.local.call = call
    try:
        return _patch.originals["from_pretrained"].__func__(cls, *args, **kwargs)
    finally:
        _patch.local.call = outer
        if call.served is not None:
            call.served.cancel()
            call.served = None
            call.report.early += "; dropped: from_pretrained ended before it took the tensors"
            _last[0] = call.report


def _ferry_safe_open(*args: Any, **kwargs: Any) -> Any:
    """transformers' ``safe_open`` while the patch is installed: ferry's handle for a file of the
    load this thread is running, if ferry serves it; safetensors' own otherwise."""
    served: Optional[_ServedFiles] = getattr(_patch.local, "served", None)
    filename = args[0] if args else kwargs.get("filename")
    framework = args[1] if len(args) > 1 else kwargs.get("framework", "pt")
    device = args[2] if len(args) > 2 else kwargs.get("device", "cpu")
    if served is not None and framework in ("pt", "torch") and served.serves(filename):
        handle = served.handle(filename, device)
        if handle is not None:
            return handle
    return _patch.originals["safe_open"](*args, **kwargs)


def _ferry_load_pretrained_model(model: Any, state_dict: Any, checkpoint_files: Any,
                                 load_config: Any, *args: Any, **kwargs: Any) -> Any:
    """``PreTrainedModel._load_pretrained_model`` while the patch is installed: decides whether
    ferry reads this load's files, then runs transformers' own."""
    module = _patch.module
    original = _patch.originals["_load_pretrained_model"].__func__
    zero3 = getattr(module, "is_deepspeed_zero3_enabled", None)
    device, why = decide(state_dict, checkpoint_files, load_config,
                         deepspeed_zero3=bool(zero3 and zero3()),
                         on_hf_mount=getattr(module, "_is_on_hf_mount", None))
    call: Optional[_Call] = getattr(_patch.local, "call", None)
    early = call.served if call is not None else None
    report = call.report if call is not None else TransformersLoadReport("", "-")
    if call is None and _patch.no_early:
        report.early = f"started when transformers asked, not before: {_patch.no_early}"
    if call is not None:
        _patch.local.call, call.served = None, None  # this load takes the call's reads
        report.model_built_s = time.perf_counter() - call.start
    report.model, report.device = type(model).__name__, device or "-"
    dtype = getattr(load_config, "dtype", None)
    start = early.started_at if early is not None and early.started_at else time.perf_counter()
    if early is not None:
        differs = why if device is None else early.matches(checkpoint_files, device, dtype)
        if differs:
            early.cancel()
            report.early += f"; dropped unused: {differs}"
            early = None
    if device is None:
        report.files = [FileReport(os.fspath(f), "stock", why, _size(f))
                        for f in (checkpoint_files or [])]
        try:
            return original(model, state_dict, checkpoint_files, load_config, *args, **kwargs)
        finally:
            report.load_seconds = time.perf_counter() - start
            _last[0] = report
    served = early or _ServedFiles(checkpoint_files, device, report, dtype)
    if device == SLICES:
        served.mesh = _mesh_words(load_config.device_mesh)
        report.device = f"{SLICES}, {served.mesh}"
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
    model_class = module.PreTrainedModel
    originals = _patch.originals
    originals["_load_pretrained_model"] = inspect.getattr_static(model_class,
                                                                 "_load_pretrained_model")
    originals["safe_open"] = module.safe_open
    model_class._load_pretrained_model = staticmethod(_ferry_load_pretrained_model)
    module.safe_open = _ferry_safe_open
    _patch.no_early = _early_seam(module)
    if _patch.no_early:
        return  # loads still go through ferry, read when transformers asks
    originals["from_pretrained"] = inspect.getattr_static(model_class, "from_pretrained")
    originals["_get_dtype"] = module._get_dtype
    model_class.from_pretrained = classmethod(_ferry_from_pretrained)
    module._get_dtype = _ferry_get_dtype
    if hasattr(module, "caching_allocator_warmup"):
        originals["caching_allocator_warmup"] = module.caching_allocator_warmup
        module.caching_allocator_warmup = _ferry_warmup


def _uninstall() -> None:
    module = _patch.module
    if module is None:
        return
    for name, original in _patch.originals.items():
        owner = module.PreTrainedModel if name in _CLASS_ATTRS else module
        setattr(owner, name, original)
    _patch.originals = {}
    _patch.module = None


# The patched names that live on PreTrainedModel (the rest are modeling_utils' globals).
_CLASS_ATTRS = ("_load_pretrained_model", "from_pretrained")


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


__all__ = ["SLICES", "FileReport", "TransformersLoadReport", "decide", "disable", "enable",
           "from_pretrained", "is_enabled", "last_load_report", "loading"]
