"""ferry: read files into GPU or host memory by the fastest path the machine has, and report
which path every request took.

    import ferry, cupy
    a = cupy.empty(1 << 28, cupy.float32)
    with ferry.open("/data/x.bin") as f:
        f.read(a)
        print(f.last_route)

The route of a request has one name everywhere: ``File.last_route``, ``Future.last_route`` and
``ferry.last_route()`` (None before the first request).

Buffers: CuPy arrays and PyTorch CUDA tensors (CUDA Array Interface), NumPy arrays, bytearray,
memoryview and anything with the buffer protocol, PyTorch CPU tensors and JAX arrays (DLPack).
I/O runs with the GIL released. ``await f.aread(buf)``/``awrite`` never block an asyncio loop.
KvikIO's API is ``ferry.kvikio`` (``import ferry.kvikio as kvikio``; docs/kvikio.md).
"""

from __future__ import annotations

import os
from typing import Any, Union

from . import _ferry
from ._arrays import fromfile, last_route, load, read_into
from .checkpoint import CheckpointError, last_load_report, load_checkpoint, save_checkpoint
from ._errors import CudaError, Error, IoError, RouteError, SettingError
from ._file import File
from ._future import Future
from ._weights import Shard, WeightsReport, iter_weights
from ._settings import as_text as _as_text
from ._settings import settings
from ._ferry import (CudaStatus, PageCacheResidency, RouteReason, RouteReport, SourceCounts, Stats,
                     cuda_status, free_idle_staging, page_cache_residency, remote_support,
                     warm_up)

__version__: str = _ferry.__version__

# cuFile's status and buffer registration exist when the library was built with them.
if hasattr(_ferry, "cufile_status"):
    from ._ferry import RegisteredBuffer, cufile_status, register_buffer

__all__ = [
    "CheckpointError", "CudaError", "CudaStatus", "Error", "File", "Future", "IoError",
    "PageCacheResidency", "RegisteredBuffer", "last_load_report", "load_checkpoint",
    "RouteError", "RouteReason", "RouteReport", "SettingError", "Shard", "Stats", "cuda_status",
    "cufile_status", "free_idle_staging", "fromfile", "last_route", "load", "open",
    "page_cache_residency", "read_into", "remote_support", "SourceCounts",
    "register_buffer", "save_checkpoint", "settings", "stats", "warm_up", "WeightsReport",
    "iter_weights",
]


def open(path: Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"], mode: str = "r",
         direct: bool = False, **settings: Any) -> File:
    """Opens `path` (a str, bytes or ``os.PathLike``; a NUL byte is a ValueError) in `mode` "r", "r+", "w", "w+" or "a" (always
    binary; any other mode is a ValueError); `direct` asks for O_DIRECT (falling back to
    buffered I/O with a reason in the route report). Keyword arguments override settings for
    this file only: ``ferry.open(p, task_size="1MiB", compat="on")``."""
    return File(path, mode, direct, _as_text(settings))


class _StatsAccessor:
    """``ferry.stats()`` returns the process counters; ``ferry.stats.reset()`` clears them.
    ``ferry.stats.publish(False)`` stops publishing them for ``ferry stats -p PID`` (and
    ``publish(True)`` starts again); ``ferry.stats.of(pid)`` reads another process's."""

    def __call__(self) -> Stats:
        return _ferry.stats()

    def reset(self) -> None:
        _ferry.reset_stats()

    def publish(self, flag: bool = True) -> "_ferry.PublishStatus":
        """Publishes (True) or withdraws (False) this process's counters now, in its segment
        /dev/shm/ferry.<uid>.<pid> (docs/stats.md); the counting goes on either way. Returns the
        status, which is falsy (with ``why_not``) when publishing failed."""
        return _ferry.publish_stats(bool(flag))

    @property
    def published(self) -> "_ferry.PublishStatus":
        """Whether this process's counters are published now, where, or why not."""
        return _ferry.publish_status()

    def of(self, pid: int, directory: str = "") -> dict[str, Any]:
        """Process `pid`'s published counters, as ``ferry stats -p PID --json`` prints them
        under "process". Raises ferry.Error (permission denied, no such process...)."""
        import json
        result: dict[str, Any] = json.loads(_ferry.process_stats_json(int(pid), directory))
        return result

    def __repr__(self) -> str:
        return repr(_ferry.stats())


stats = _StatsAccessor()
