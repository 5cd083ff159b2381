"""CUDA streams as the stream-taking calls accept them (``File.read_async``, ``ferry.kvikio``):
an int (a CUstream), a CuPy stream, a PyTorch stream, or an object with ``__cuda_stream__``."""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Optional

from . import _errors as ferry_errors

def stream_handle(stream: Any) -> int:
    """The CUstream of `stream`: an int (KvikIO's ``raw_stream``), a CuPy stream (``.ptr``), a
    PyTorch stream (``.cuda_stream``) or an object with ``__cuda_stream__``; None is the
    default stream (0)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        return int(protocol()[1])
    for attr in ("ptr", "cuda_stream"):
        handle = getattr(stream, attr, None)
        if handle is not None:
            return int(handle)
    raise TypeError(f"ferry: stream must be an int (a CUstream), a CuPy or PyTorch stream "
                    f"or have __cuda_stream__, not {type(stream).__name__}")


_cuda_lock = threading.Lock()
_libcuda: Optional[ctypes.CDLL] = None


def _cuda() -> ctypes.CDLL:
    global _libcuda
    with _cuda_lock:
        if _libcuda is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise ferry_errors.CudaError(f"ferry: cannot synchronise a CUDA stream: "
                                             f"libcuda.so.1 does not load ({e})") from None
            lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
            lib.cuStreamSynchronize.restype = ctypes.c_int
            _libcuda = lib
        return _libcuda


def synchronize(stream: Any) -> None:
    """Waits for the work queued on `stream` (its own ``synchronize()``, else
    cuStreamSynchronize), with the GIL released."""
    sync = getattr(stream, "synchronize", None)
    if callable(sync) and not isinstance(stream, int):
        sync()
        return
    result = _cuda().cuStreamSynchronize(ctypes.c_void_p(stream_handle(stream)))
    if result != 0:
        e = ferry_errors.CudaError(f"ferry: cuStreamSynchronize failed: CUDA error "
                                   f"{result}")
        e.code = result
        raise e
