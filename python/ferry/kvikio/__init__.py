"""``ferry.kvikio``: KvikIO's Python API on ferry, so that KvikIO code runs unchanged with one
line changed:

    import ferry.kvikio as kvikio

    with kvikio.CuFile("/data/x.bin", "r") as f:
        future = f.pread(cupy_array)           # ferry's tasks, on ferry's workers
        n = future.get()
        print(future.last_route)               # and the route report of every request

What is here: ``CuFile`` (open/close/closed/fileno/open_flags, read/write/pread/pwrite,
raw_read/raw_write, raw_read_async/raw_write_async and read_async/write_async with a stream),
``IOFuture``, ``IOFutureStream``, ``CompatMode``, ``defaults`` (get/set, as a context manager
and with a dict), ``numpy`` (fromfile/tofile/LikeWrapper), ``get_page_cache_info``,
``drop_file_page_cache``, ``drop_system_page_cache``, ``cufile_driver``, ``buffer``. KvikIO's
environment variables (KVIKIO_COMPAT_MODE, KVIKIO_NTHREADS/KVIKIO_NUM_THREADS, KVIKIO_TASK_SIZE,
KVIKIO_GDS_THRESHOLD, KVIKIO_BOUNCE_BUFFER_SIZE) are ferry's own settings' fallbacks.

What differs (docs/kvikio.md has the whole mapping): the defaults are ferry's (8 threads for
GPU memory, 16 for host memory, not KvikIO's 1); the stream-taking calls are not yet
stream-ordered (they synchronise the stream, then read, as KvikIO does in compatibility mode);
``RemoteFile`` reads HTTP, HTTPS and S3 objects through ferry's remote sources (docs/remote.md);
what KvikIO has and ferry does not (WebHDFS, Mmap, zarr, nvcomp, stream_register...) raises
NotImplementedError naming it.
"""

from __future__ import annotations

from typing import Any

from .. import __version__ as _ferry_version
from . import buffer, cufile_driver, defaults, mmap, numpy, nvcomp, remote_file, utils, zarr
from ._enums import CompatMode, RemoteIOBackend
from ._errors import runtime_class
from ._missing import NotInFerry, fail
from .cufile import (CuFile, IOFuture, IOFutureStream, clear_page_cache, drop_file_page_cache,
                     drop_system_page_cache, get_page_cache_info)
from .defaults import LimitWarning
from .remote_file import (RemoteEndpointType, RemoteFile, infer_remote_endpoint_type,
                          is_remote_file_available)

__all__ = [
    "CompatMode", "CuFile", "IOFuture", "IOFutureStream", "LimitWarning", "NotInFerry",
    "RemoteEndpointType", "RemoteFile", "RemoteIOBackend", "buffer", "clear_page_cache", "cufile_driver", "defaults",
    "drop_file_page_cache", "drop_system_page_cache", "get_page_cache_info",
    "infer_remote_endpoint_type", "is_remote_file_available", "mmap", "numpy", "nvcomp", "remote_file", "runtime_class",
    "stream_deregister", "stream_register", "utils", "zarr",
]

# ferry's version: code that compares KvikIO versions sees ferry's, not a KvikIO one it is not.
__version__: str = _ferry_version
__git_commit__: str = ""


def stream_register(stream: Any, flags: int) -> None:
    """KvikIO's cuFileStreamRegister: NotImplementedError (ferry does not use cuFile's stream
    API; its stream-taking calls synchronise the stream, then read)."""
    fail("kvikio.stream_register", "ferry does not use cuFile's stream API; the stream-taking "
         "reads and writes synchronise the stream first (not yet stream-ordered)")


def stream_deregister(stream: Any) -> None:
    """KvikIO's cuFileStreamDeregister: NotImplementedError (as ``stream_register``)."""
    fail("kvikio.stream_deregister", "ferry does not use cuFile's stream API")


_MISSING = {
    "Mmap": "no Mmap: read ranges with CuFile.pread",
}


def __getattr__(name: str) -> Any:
    if name in _MISSING:
        fail(f"kvikio.{name}", _MISSING[name])
    raise AttributeError(f"module 'ferry.kvikio' has no attribute {name!r}")
