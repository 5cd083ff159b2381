"""``ferry.File``: an open file that reads into and writes from host or GPU memory. The I/O is
the C++ core's (``_ferry.File``); this class adds what Python files do: ``repr``, a
``ResourceWarning`` when dropped open, Futures that compose, and ``aread``/``awrite`` for
asyncio."""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

from . import _ferry
from ._future import Future, off_loop
from ._streams import stream_handle

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


class File(_ferry.File):
    """An open file (``ferry.open``). Thread-safe: several threads may read and write one File.

    Sizes and offsets are in bytes. After ``close()``, ``path``, ``mode`` and ``last_route``
    still answer, and I/O raises ``ValueError`` as a closed Python file does. A File dropped
    without ``close()`` (or a ``with`` block) is closed by the garbage collector, with a
    ``ResourceWarning``."""

    def __init__(self, path: PathLike, mode: str = "r", direct: bool = False,
                 settings: Optional[Mapping[str, str]] = None) -> None:
        super().__init__(path, mode, direct, dict(settings or {}))
        self._opened = True  # __del__ must not touch a File whose __init__ failed

    if TYPE_CHECKING:
        # pread and pwrite are C methods (_ferry.add_future_methods, below the class): a Python
        # frame here and Future.__init__ cost more than the 4 KiB read (bench/NOTES.md §48).
        def pread(self, buf: Any, size: Optional[int] = None, file_offset: int = 0) -> Future:
            """Starts reading `size` bytes (default: the whole buffer) at `file_offset` into
            `buf`; the Future's result is the bytes read. The buffer is kept alive until the read
            ends."""

        def pwrite(self, buf: Any, size: Optional[int] = None, file_offset: int = 0) -> Future:
            """Starts writing `buf` (or its first `size` bytes) at `file_offset`; the Future's
            result is the bytes written. The buffer is kept alive until the write ends."""

    def pread_ranges(self, buf: Any, ranges: Any) -> Future:
        """Starts a gathered read of `ranges` ((n, 3) integers: file offset, length, buffer
        offset, in bytes) into `buf`; see ``read_ranges``. The Future's result is the bytes read."""
        return Future(super().pread_ranges(buf, ranges))

    def pwrite_ranges(self, buf: Any, ranges: Any) -> Future:
        """Starts a scattered write of `ranges` ((n, 3) integers: file offset, length, buffer
        offset, in bytes) from `buf`; see ``write_ranges``. The Future's result is the bytes
        written."""
        return Future(super().pwrite_ranges(buf, ranges))

    def read_async(self, buf: Any, stream: Any = None, size: Optional[int] = None,
                   file_offset: int = 0) -> Future:
        """Stream-ordered read into `buf` (GPU or host memory) on `stream`: a CuPy or PyTorch
        stream, an object with ``__cuda_stream__``, or a CUstream int; None is the legacy
        default stream. The bytes land after the work queued on the stream before this call,
        and the work queued after sees them; this thread is not blocked and the stream is not
        synchronised. The Future completes with the bytes read (or the error: a failed read
        still lets the stream go on). Keep `buf` allocated until the stream has passed the
        read: the Future holds it until the read completes."""
        return Future(super().read_async(buf, stream_handle(stream), size, file_offset))

    def write_async(self, buf: Any, stream: Any = None, size: Optional[int] = None,
                    file_offset: int = 0) -> Future:
        """Stream-ordered write of `buf` (or its first `size` bytes) at `file_offset`: it writes
        what the work queued on `stream` before left in the buffer, and the work queued after
        waits until the write has read it. See ``read_async``."""
        return Future(super().write_async(buf, stream_handle(stream), size, file_offset))

    async def aread(self, buf: Any, size: Optional[int] = None, file_offset: int = 0) -> int:
        """``await f.aread(buf)``: reads like ``read`` and returns the bytes read, without ever
        blocking the event loop (the request starts in a thread of ferry's, so a small read that
        ferry runs in the submitting thread waits there). The calling thread's settings apply,
        scopes included. Cancelling the task cancels the read; the buffer is not written after
        the ``CancelledError``."""
        return await off_loop(lambda: self.pread(buf, size, file_offset))

    async def awrite(self, buf: Any, size: Optional[int] = None, file_offset: int = 0) -> int:
        """``await f.awrite(buf)``: writes like ``write`` and returns the bytes written, without
        ever blocking the event loop (as ``aread``). A cancelled write may have written part of
        the range: the file then holds some of the new bytes."""
        return await off_loop(lambda: self.pwrite(buf, size, file_offset))

    def __enter__(self) -> "File":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_opened", False) and not self.closed:
            # At interpreter exit warnings can no longer import what it needs: close quietly.
            if sys.is_finalizing():
                self.close()
                return
            warnings.warn(f"unclosed ferry.File {self.path!r} (mode {self.mode!r})",
                          ResourceWarning, stacklevel=2, source=self)
            self.close()

    def __repr__(self) -> str:
        if not getattr(self, "_opened", False):
            # Its C++ part was never made: reading any of its properties would crash. pytest
            # shows `self` of the failed __init__ in a traceback, so this is reached.
            return "<ferry.File (not opened: its __init__ raised)>"
        state = "closed" if self.closed else "open"
        if not self.closed and self.in_flight:
            state += f", {self.in_flight} request(s) in flight"
        return f"<ferry.File path={self.path!r} mode={self.mode!r} {state}>"


_ferry.add_future_methods(File, Future)
