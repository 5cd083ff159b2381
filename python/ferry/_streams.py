"""CUDA streams as the stream-taking calls accept them (``File.read_async``, ``ferry.kvikio``):
an int (a CUstream), a CuPy stream, a PyTorch stream, or an object with ``__cuda_stream__``."""

from __future__ import annotations

from typing import Any, Iterable

from . import _ferry


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


def synchronize(stream: Any) -> None:
    """Waits for the work queued on `stream` (its own ``synchronize()``, else
    cuStreamSynchronize through the driver ferry loaded), with the GIL released."""
    sync = getattr(stream, "synchronize", None)
    if callable(sync) and not isinstance(stream, int):
        sync()
        return
    _ferry.synchronize_stream(stream_handle(stream))


def wait_for_torch(tensors: Iterable[Any]) -> None:
    """Before ferry's copies, which run on streams of its own, read or write `tensors`: waits for
    the work queued on the current stream of each GPU they are on."""
    import torch
    for device in {t.device for t in tensors if t.device.type == "cuda"}:
        torch.cuda.current_stream(device).synchronize()


def settle(array: Any) -> None:
    """Before ferry writes into `array`, just allocated by torch or CuPy in GPU memory: waits for
    the work queued on the current stream, where that is not the legacy default stream. Their
    allocators give a block freed on a stream to the next allocation on it at once, trusting the
    next writer to be queued there after the work that read it; ferry's copies run on its own
    streams, ordered after the legacy default stream only."""
    module = type(array).__module__
    if module.startswith("torch") and array.device.type == "cuda":
        settle_torch(array.device)
    elif module.startswith("cupy"):
        settle_cupy(array.device.id)


def settle_torch(device: Any) -> None:
    """``settle`` for torch's allocations on `device` (a torch.device of type cuda)."""
    import torch
    stream = torch.cuda.current_stream(device)
    if stream.cuda_stream != 0:
        stream.synchronize()


def settle_cupy(ordinal: int) -> None:
    """``settle`` for CuPy's allocations on GPU `ordinal`."""
    import cupy
    with cupy.cuda.Device(ordinal):
        stream = cupy.cuda.get_current_stream()
    if stream.ptr != 0:
        stream.synchronize()
