"""ferry.dcp: a torch.distributed.checkpoint storage writer and reader (issue 51).

Switching from stock DCP is one line::

    dcp.save(state_dict, storage_writer=ferry.dcp.FileSystemWriter(path))

The folder is stock DCP (stock ``dcp.load`` reads it), written crash-safe: each save's
``.distcp`` files get names of their own, are fsynced with the folder, and the coordinator
commits by one rename of ``.metadata`` after every rank succeeded; the files of the old
checkpoint go only then. A second writer on the same folder is refused. The tensors' bytes are
written by ferry's C++ write path from the memory they live in (docs/training.md). Its reader
loads stock's folders and ferry's alike, each tensor's bytes read by ferry's C++ DCP reader
straight into the tensors the load fills, host or GPU memory::

    dcp.load(state_dict, storage_reader=ferry.dcp.FileSystemReader(path))
"""
from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import torch

try:
    from torch.distributed.checkpoint.filesystem import FileSystem as _FileSystem
    from torch.distributed.checkpoint.filesystem import FileSystemReader as _StockReader
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (Metadata, StorageMeta,
                                                       TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner,
                                                      SavePlan, SavePlanner, WriteItemType)
    from torch.distributed.checkpoint.staging import AsyncStager
    from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
    from torch.futures import Future
except Exception as e:  # absent in torch 1.x; torch.distributed._shard fails on Python 3.11
    raise ImportError(
        f"ferry.dcp needs torch.distributed.checkpoint (torch 2.x), which torch "
        f"{torch.__version__} here cannot import ({type(e).__name__}: {e})") from None

from . import _ferry, _progress, _streams
from ._save import _TORCH_FORMAT
from ._stager import Stager as _Stager

__all__ = ["FileSystemWriter", "FileSystemReader", "SaveReport", "Stager"]

_METADATA = ".metadata"


@dataclasses.dataclass
class _SavePrefix:
    """The coordinator's word to each rank: its file prefix and the save's id (in file names)."""

    prefix: str
    save_id: str


def _rows(items: List[Any], planner: SavePlanner, keep: List[Any]) -> List[tuple]:
    rows: List[tuple] = []
    for item in items:
        fqn = item.index.fqn
        data = planner.resolve_data(item)
        if item.type == WriteItemType.BYTE_IO:
            rows.append((fqn, bytes(data.getbuffer())))
            continue
        if not isinstance(data, torch.Tensor) or data.layout != torch.strided:
            raise TypeError(f"ferry.dcp: item '{fqn}' is {type(data).__name__}"
                            f"{'' if not isinstance(data, torch.Tensor) else ' ' + str(data.layout)}"
                            f"; ferry's DCP writer saves dense tensors and byte items")
        t = data.detach()
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"ferry.dcp: tensor '{fqn}' is on {t.device}; ferry saves from CPU "
                             f"and CUDA memory")
        fmt = _TORCH_FORMAT.get(str(t.dtype).split(".")[-1])
        if fmt is None:
            raise TypeError(f"ferry.dcp: tensor '{fqn}' is {t.dtype}, which ferry's DCP writer "
                            f"does not save yet")
        if not t.is_contiguous():
            t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        keep.append(t)
        rows.append((fqn, fmt, tuple(int(d) for d in t.shape), t.data_ptr() if nbytes else 0,
                     nbytes))
    _streams.wait_for_torch(keep)
    return rows


class SaveReport:
    """This rank's part of the last save through a ``FileSystemWriter``: the report of each
    ``.distcp`` file it wrote (bytes, fsyncs, seconds, and a route report at both layers per
    gathered write) and, on the coordinator, the commit's: ``.metadata`` renamed over the old
    one, the commit point."""

    def __init__(self, writes: List[Any], commit: Any = None) -> None:
        self.writes = writes
        self.commit = commit

    @property
    def files(self) -> List[str]:
        return [f for r in self.writes for f in r.files] + (self.commit.files if self.commit else [])

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.writes) + (self.commit.bytes if self.commit else 0)

    @property
    def tensors(self) -> int:
        return sum(r.tensors for r in self.writes)

    @property
    def fsyncs(self) -> int:
        return sum(r.fsyncs for r in self.writes) + (self.commit.fsyncs if self.commit else 0)

    @property
    def routes(self) -> List[Any]:
        return [route for r in self.writes for route in r.routes]

    @property
    def committed(self) -> Optional[str]:
        """The ``.metadata`` this rank committed (the coordinator), else None."""
        return self.commit.files[0] if self.commit else None

    def summary(self) -> str:
        seconds = sum(r.seconds for r in self.writes)
        rate = _ferry.format_rate(sum(r.bytes for r in self.writes) / seconds) if seconds else "-"
        where = (f"committed by renaming {self.committed} in {self.commit.seconds:.3f} s"
                 if self.commit else "no commit by this rank (the coordinator commits)")
        return (f"{self.tensors} tensor(s), {_ferry.format_size(self.bytes, True)} in "
                f"{len(self.files)} file(s), {self.fsyncs} fsync(s); data {seconds:.3f} s "
                f"({rate}); {where}")

    def __repr__(self) -> str:
        return f"<ferry.dcp.SaveReport {self.summary()}>"


class FileSystemWriter(StorageWriter):
    """Stock ``FileSystemWriter``'s arguments and output, written crash-safe by ferry.

    ``thread_count`` and ``per_thread_copy_ahead`` are accepted for compatibility: ferry's
    write path splits and stages the writes itself. ``sync_files=False`` skips the fsyncs (the
    renames still commit whole, but a power loss may lose what the page cache held).
    ``progress`` (not stock's) draws a bar or calls back as ``ferry.save_file``'s does, per
    ``.distcp`` file. ``last_report`` is this rank's ``SaveReport`` of the last save.
    """

    last_report: Optional[SaveReport] = None

    def __init__(self, path: Union[str, os.PathLike], single_file_per_rank: bool = True,
                 sync_files: bool = True, thread_count: int = 1,
                 per_thread_copy_ahead: int = 10_000_000, cache_staged_state_dict: bool = False,
                 overwrite: bool = True, *, progress: Any = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.single_file_per_rank = single_file_per_rank
        self.sync_files = sync_files
        self.thread_count = thread_count
        self.per_thread_copy_ahead = per_thread_copy_ahead
        self.cache_staged_state_dict = cache_staged_state_dict
        self.overwrite = overwrite
        _progress.check(progress)
        self.progress = progress
        self.save_id = uuid.uuid4().hex
        self.is_coordinator = False
        self._lock: Any = None

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.save_id = uuid.uuid4().hex
        self._lock = None  # a save that failed before its commit held it

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if not self.overwrite and (self.path / _METADATA).exists():
            raise RuntimeError(f"Checkpoint already exists and self.overwrite=False: "
                               f"{self.path / _METADATA}")
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        # Before any rank writes: the folder made, and a second writer refused.
        self._lock = _ferry.DcpSaveLock(str(self.path), self.sync_files)
        return [dataclasses.replace(plan, storage_data=_SavePrefix(f"__{i}_", self.save_id))
                for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        where: _SavePrefix = plan.storage_data
        groups = [plan.items] if self.single_file_per_rank else [[i] for i in plan.items]
        results: List[WriteResult] = []
        reports: List[Any] = []
        for k, items in enumerate(g for g in groups if g):
            name = f"{where.prefix}{k}.{where.save_id}.distcp"
            keep: List[Any] = []
            rows = _rows(items, planner, keep)
            callback = _progress.reporter(self.progress, "saving " + name)
            try:
                places, report = _ferry.dcp_write_file(rows, str(self.path / name),
                                                       self.sync_files, progress=callback)
            finally:
                _progress.close(callback)
            reports.append(report)
            for item, (offset, length) in zip(items, places):
                results.append(WriteResult(index=item.index, size_in_bytes=length,
                                           storage_data=_StorageInfo(name, offset, length)))
        self.last_report = SaveReport(reports)
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        try:
            storage: Dict[Any, Any] = {}
            for rank_results in results:
                storage.update({r.index: r.storage_data for r in rank_results})
            metadata.storage_data = storage
            metadata.storage_meta = self.storage_meta()
            files = sorted({info.relative_path for info in storage.values()})
            commit = _ferry.dcp_commit(str(self.path), pickle.dumps(metadata), files,
                                       self.sync_files)
            self.last_report = SaveReport(self.last_report.writes if self.last_report else [],
                                          commit)
        finally:
            self._lock = None

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    @property
    def metadata_path(self) -> Path:
        return self.path / _METADATA

    @property
    def checkpoint_id(self) -> Union[str, os.PathLike]:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike]) -> bool:
        return _FileSystem.validate_checkpoint_id(checkpoint_id)


# What DCP's .metadata pickles (tests/data/dcp/README.md), and nothing that runs code.
_ALLOWED = {("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("torch", "Size"),
            ("torch.serialization", "_get_layout"), ("collections", "OrderedDict")}
_ALLOWED_MODULES = ("torch.distributed.checkpoint.metadata",
                    "torch.distributed.checkpoint.filesystem")


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) in _ALLOWED or module in _ALLOWED_MODULES or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"ferry.dcp: {self._path} names the class {module}.{name}, which DCP's metadata "
            f"does not hold; refused rather than run it")


class FileSystemReader(_StockReader):
    """Stock ``FileSystemReader``'s arguments, reading by ferry's C++ DCP reader.

    ``.metadata`` is unpickled with an allow-list of the classes DCP writes (a hostile
    checkpoint's code is refused, naming its class). ``read_data`` reads each tensor item's bytes
    from its ``.distcp`` file straight into the tensor the planner resolves, host or GPU memory,
    by ferry's gathered reads (``_ferry.dcp_read``): the path ``ferry load DIR`` takes, not
    torch.load of each blob into host memory and a copy. A target of another dtype than the
    saved one, or a non-contiguous one, is read into a temporary tensor on its device and copied
    (cast) from it. Byte items, and items whose storage carries torch's stream transforms, go to
    stock's ``read_data``. ``last_report`` is the last read's LoadReport (bytes, seconds, routes).
    """

    last_report: Any = None

    def read_metadata(self) -> Metadata:
        path = Path(self.path) / _METADATA
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(io.BufferedReader(f), path).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._saved_dtypes = {fqn: md.properties.dtype
                              for fqn, md in metadata.state_dict_metadata.items()
                              if isinstance(md, TensorStorageMetadata)}

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        rows: List[tuple] = []
        landed: List[tuple] = []
        stock: List[Any] = []
        dtypes = getattr(self, "_saved_dtypes", {})
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            saved = dtypes.get(req.storage_index.fqn)
            fmt = _TORCH_FORMAT.get(str(saved).split(".")[-1]) if saved is not None else None
            if (req.type == LoadItemType.BYTE_IO or fmt is None
                    or getattr(info, "transform_descriptors", None)):
                stock.append(req)
                continue
            target = planner.resolve_tensor(req).detach()
            if target.device.type not in ("cpu", "cuda"):
                stock.append(req)
                continue
            if tuple(target.shape) != tuple(req.lengths):
                raise ValueError(f"ferry.dcp: {self.path}: tensor '{req.storage_index.fqn}' "
                                 f"resolves to a target of shape {tuple(target.shape)} for a "
                                 f"region of {tuple(req.lengths)}")
            into = target
            if target.dtype != saved or not target.is_contiguous():
                into = torch.empty(tuple(req.lengths), dtype=saved, device=target.device)
            rows.append((req.storage_index.fqn, info.relative_path, info.offset, info.length,
                         fmt, list(req.storage_offsets), list(req.lengths),
                         into.data_ptr() if into.numel() else 0))
            landed.append((req, target, into))
        if rows:
            _streams.wait_for_torch(t for _, t, _ in landed)
            self.last_report = _ferry.dcp_read(str(self.path), rows)
            for req, target, into in landed:
                if into is not target:
                    target.copy_(into)
                planner.commit_tensor(req, target)
        if stock:
            super().read_data(dataclasses.replace(plan, items=stock), planner).wait()
        fut: Future = Future()
        fut.set_result(None)
        return fut


def _async_save_takes_futures() -> bool:
    # torch's async_save accepts a Future from stage() where it returns an AsyncSaveResponse.
    from torch.distributed.checkpoint import state_dict_saver
    return hasattr(state_dict_saver, "AsyncSaveResponse")


class Stager(_Stager, AsyncStager):
    """torch's ``AsyncStager`` over ferry's pinned pool (``ferry._stager.Stager``)::

        stager = ferry.dcp.Stager()          # kept for the whole run; its pool is reused
        response = dcp.async_save(sd, storage_writer=ferry.dcp.FileSystemWriter(path),
                                  async_stager=stager)
        response.staging_completion.result()  # from here the tensors may change again
        response.upload_completion.result()   # the checkpoint is committed
        stager.close()                        # after the last save

    ``stage()`` returns a Future, so ``async_save`` returns at once with an
    ``AsyncSaveResponse``. A torch whose ``async_save`` takes no Future gets the staged state
    dict itself, after the copies landed.
    """

    def stage(self, state_dict: Any) -> Any:
        future = super().stage(state_dict)
        return future if _async_save_takes_futures() else future.result()
