"""``kvikio.buffer``: registering GPU memory with cuFile (``ferry.register_buffer``)."""

from __future__ import annotations

import threading
from typing import Any

from .. import _ferry

__all__ = ["bounce_buffer_free", "memory_deregister", "memory_register"]

_lock = threading.Lock()
_registered: dict[int, Any] = {}  # device address -> ferry.RegisteredBuffer


def memory_register(buf: Any) -> None:
    """Registers GPU memory with cuFile (cuFileBufRegister) until ``memory_deregister(buf)``:
    for a buffer reused by many cuFile requests. Where cuFile is missing, RuntimeError."""
    register = getattr(_ferry, "register_buffer", None)
    if register is None:
        raise RuntimeError("cuFile is not available: this ferry was built without cuFile "
                           "support")
    address = _ferry.buffer_info(buf, False)[0]
    registration = register(buf)
    with _lock:
        old = _registered.pop(address, None)
        _registered[address] = registration
    if old is not None:
        old.close()


def memory_deregister(buf: Any) -> None:
    """Ends the registration ``memory_register(buf)`` made; RuntimeError when `buf` is not
    registered (cuFile refuses that too)."""
    address = _ferry.buffer_info(buf, False)[0]
    with _lock:
        registration = _registered.pop(address, None)
    if registration is None:
        raise RuntimeError(f"kvikio.buffer.memory_deregister: the buffer at {address:#x} was not "
                           "registered with memory_register")
    registration.close()


def bounce_buffer_free() -> int:
    """KvikIO's bounce_buffer_free: frees the staging buffers of ferry's default runtime that no
    request is using and returns their bytes (``ferry.free_idle_staging()``). ferry keeps two
    buffers of ``bounce_buffer_size`` (at least 4 KiB) per worker that needed them, so the count
    differs from KvikIO's one buffer per thread."""
    return int(_ferry.free_idle_staging())
