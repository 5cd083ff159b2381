"""``kvikio.CuFile`` and its futures, on ``ferry.File``; KvikIO's page-cache helpers.

A CuFile is a ``ferry.File`` plus the descriptor that KvikIO's ``fileno()`` and
``open_flags()`` report (opened with KvikIO's flags). Every read and write is ferry's: split
into tasks, run on ferry's workers, routed with a report (``IOFuture.last_route``,
``CuFile.last_route``). Errors are ferry's with ``RuntimeError`` mixed in, as KvikIO raises.

The stream-taking calls (``raw_read_async``, ``raw_write_async``, ``read_async``,
``write_async``) are NOT YET STREAM-ORDERED: like KvikIO in compatibility mode, they synchronise
the stream, then read or write, and return when the bytes are in place (the caller waits; work
queued on the stream before the call has finished, work queued after it sees the data).
"""

from __future__ import annotations

import errno
import io
import mmap
import operator
import os
from typing import Any, Optional, Union

from .. import _errors as ferry_errors
from .. import _ferry
from .. import _streams
from .._file import File
from .._future import Future
from ._errors import EPERM, io_error, kvikio_error

__all__ = ["CuFile", "IOFuture", "IOFutureStream", "clear_page_cache", "drop_file_page_cache",
           "drop_system_page_cache", "get_page_cache_info"]

PathLike = Union[str, "os.PathLike[str]"]

# KvikIO's flags -> (ferry's mode, the open(2) flags of the descriptor fileno() returns). Mode
# "a" has no O_APPEND: ferry's appends do not go through O_APPEND (a request's tasks would land in
# the order they finish); each reserves the end of the file under an OFD lock, which orders
# appends across Files and processes (docs/reliability.md). open_flags() says what is true.
_MODES = {
    "r": ("r", os.O_RDONLY),
    "r+": ("r+", os.O_RDWR),
    "w": ("w", os.O_WRONLY),
    "w+": ("w+", os.O_RDWR),
    "a": ("a", os.O_WRONLY),
}


class IOFuture(Future):
    """What ``CuFile.pread``/``pwrite`` return: ``get()`` waits and returns the bytes moved,
    ``done()`` says whether the request has ended. Also a ``ferry.Future`` (a
    ``concurrent.futures.Future``: ``result``, ``add_done_callback``, ``await``) with the
    request's route report in ``last_route``."""

    def _error(self, e: BaseException) -> BaseException:
        return kvikio_error(e)

    def get(self) -> int:
        """Waits for the request; the bytes read or written. Raises its error (a RuntimeError,
        as KvikIO's; also the ferry class, e.g. ``ferry.IoError``)."""
        return self.result()


class IOFutureStream:
    """What the stream-taking calls return: a stream-ordered request in flight.
    ``check_bytes_done()`` waits for it and synchronises its stream (as KvikIO's does), then
    returns the bytes moved or raises the request's error."""

    __slots__ = ("_future", "_stream")

    def __init__(self, future: IOFuture, stream: Any) -> None:
        self._future = future
        self._stream = stream

    def check_bytes_done(self) -> int:
        """Waits for the request and its stream; the bytes read or written."""
        n = self._future.result()
        synchronize(self._stream)
        return n

    def done(self) -> bool:
        """Whether the request has completed (the stream may still be running earlier work)."""
        return self._future.done()

    @property
    def last_route(self) -> Optional[_ferry.RouteReport]:
        """The route report of the read or write (waits for it)."""
        return self._future.last_route

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "in flight"
        return f"<ferry.kvikio.IOFutureStream: {state}>"


class _DeviceSpan:
    """`nbytes` of GPU memory at `address`, as a CUDA array (for ``dev_offset``); keeps the
    array it lies in alive."""

    def __init__(self, owner: Any, address: int, nbytes: int, readonly: bool) -> None:
        self._owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "strides": None,
                                         "data": (address, readonly), "version": 3}


def _device_memory(buf: Any) -> bool:
    """Whether `buf` is GPU memory (CUDA array interface, or DLPack on a CUDA device)."""
    if hasattr(buf, "__cuda_array_interface__"):
        return True
    device = getattr(buf, "__dlpack_device__", None)
    if device is not None:
        try:
            kind = device()[0]
        except Exception:
            return False
        return int(kind) in (2, 13)  # kDLCUDA, kDLCUDAManaged
    return False


# ---- streams (ferry._streams: shared with ferry.File.read_async) ------------------------------

stream_handle = _streams.stream_handle
synchronize = _streams.synchronize


# ---- CuFile -----------------------------------------------------------------------------------

class CuFile:
    """KvikIO's file handle, on a ``ferry.File``: ``CuFile(path, "r")``, flags "r", "r+", "w",
    "w+" or "a" (a trailing "b" is ignored). Reads and writes take host or GPU memory."""

    def __init__(self, file: PathLike, flags: str = "r") -> None:
        self._fd = -1
        self._open(file, flags)

    def open(self, file: Optional[PathLike] = None, flags: Optional[str] = None) -> None:
        """Opens the handle again after ``close()``, on `file` with `flags` (by default the
        ones it was made with; "w" truncates again). On an open handle: nothing when `file` and
        `flags` are its own (or not given), else ValueError (close it first), as KvikIO's
        FileHandle::open leaves an open handle as it is."""
        path = self._file.path if file is None else os.fspath(file)
        flags = self._flags if flags is None else flags
        if not self.closed:
            if os.path.abspath(path) == os.path.abspath(self._file.path) and flags == self._flags:
                return
            raise ValueError(f"ferry.kvikio.CuFile.open: this handle is open on "
                             f"{self._file.path!r} ({self._flags!r}); close() it first")
        self._open(path, flags)

    def _open(self, file: PathLike, flags: str) -> None:
        if not isinstance(flags, str):
            raise TypeError(f"ferry.kvikio.CuFile: flags must be a str, not "
                            f"{type(flags).__name__}")
        key = flags.replace("b", "")
        if key == "a+":
            raise NotImplementedError("ferry.kvikio.CuFile: flags 'a+' (read and append): ferry "
                                      "opens files 'r', 'r+', 'w', 'w+' or 'a'")
        if key not in _MODES:
            raise ValueError(f"Unknown file open flag: {flags!r} (r, r+, w, w+ or a)")
        self._flags = flags
        mode, os_flags = _MODES[key]
        path = os.fspath(file)
        try:
            self._file = File(path, mode)
        except ferry_errors.IoError as e:
            raise kvikio_error(e, f"Unable to open file {path!r}: {e.strerror}") from None
        try:
            self._fd = os.open(path, os_flags | os.O_CLOEXEC)
        except OSError as e:
            self._file.close()
            raise io_error(e.errno or errno.EIO, f"Unable to open file {path!r}: "
                           f"{os.strerror(e.errno or errno.EIO)}", path, "open") from None
        self._readable = key != "w" and key != "a"
        self._writable = key != "r"

    # -- the file ----------------------------------------------------------------------------

    def close(self) -> None:
        """Waits for the requests in flight and closes the file (again: nothing)."""
        if self._fd >= 0:
            try:
                self._file.close()
            except ferry_errors.Error as e:  # a write lost at close(2): KvikIO's RuntimeError
                raise kvikio_error(e) from None
            finally:
                os.close(self._fd)
                self._fd = -1

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def fileno(self) -> int:
        """The file descriptor (opened with KvikIO's flags for this file)."""
        self._check_open()
        return self._fd

    def open_flags(self) -> int:
        """The flags of the file descriptor (fcntl F_GETFL, see open(2))."""
        import fcntl

        return fcntl.fcntl(self.fileno(), fcntl.F_GETFL)

    def is_direct_io_supported(self) -> bool:
        """Whether the file system opens this file with O_DIRECT (ferry reads cold ranges
        with it by itself in compat_mode auto)."""
        try:
            fd = os.open(self._file.path, os.O_RDONLY | getattr(os, "O_DIRECT", 0) | os.O_CLOEXEC)
        except OSError:
            return False
        os.close(fd)
        return hasattr(os, "O_DIRECT")

    @property
    def last_route(self) -> Optional[_ferry.RouteReport]:
        """The route report of the last request this file completed (ferry's)."""
        return self._file.last_route

    @property
    def ferry_file(self) -> File:
        """The ``ferry.File`` under this CuFile."""
        return self._file

    def __enter__(self) -> "CuFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            try:
                self.close()
            except Exception:  # nothing to report it to from the garbage collector
                pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<ferry.kvikio.CuFile {self._file.path!r} flags={self._flags!r} {state}>"

    # -- checks ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._fd < 0:
            raise ValueError(f"ferry.kvikio.CuFile: I/O on closed file {self._file.path!r}")

    def _check(self, op: str) -> None:
        self._check_open()
        if op == "read" and not self._readable:
            raise io_error(EPERM, f"Operation not permitted: cannot read {self._file.path!r}, "
                           f"opened with flags {self._flags!r} (write only)",
                           self._file.path, "pread")
        if op == "write" and not self._writable:
            raise io_error(EPERM, f"Operation not permitted: cannot write {self._file.path!r}, "
                           f"opened with flags {self._flags!r} (read only)",
                           self._file.path, "pwrite")

    def _submit(self, op: str, buf: Any, size: Optional[int], file_offset: int,
                task_size: Optional[int]) -> IOFuture:
        method = _ferry.File.pread if op == "read" else _ferry.File.pwrite
        return IOFuture(self._call(method, op, buf, size, file_offset, task_size))

    def _call(self, method: Any, op: str, buf: Any, size: Optional[int], file_offset: int,
              task_size: Optional[int]) -> Any:
        self._check(op)
        if task_size is None:
            return method(self._file, buf, size, file_offset)
        from . import defaults

        n = defaults._unsigned(task_size, "task_size")
        if n == 0:
            raise ValueError("task size must be a positive integer")
        if n < defaults._MIN_TASK:
            import warnings

            warnings.warn(f"ferry.kvikio: task_size={n} is below ferry's smallest task_size "
                          f"({defaults._MIN_TASK} B); this request runs with "
                          f"{defaults._MIN_TASK}. The bytes moved are the same",
                          defaults.LimitWarning, stacklevel=4)
        return self._in_tasks_of(max(n, defaults._MIN_TASK), method, buf, size, file_offset)

    def _in_tasks_of(self, task: int, method: Any, buf: Any, size: Optional[int],
                     file_offset: int) -> Any:
        """``method(file, buf, size, file_offset)`` in tasks of `task` bytes: this thread's
        settings for this request only (it takes them at its start)."""
        scope = _ferry.SettingsScope({"task_size": str(task)})
        scope.enter()
        try:
            return method(self._file, buf, size, file_offset)
        finally:
            scope.exit()

    # -- KvikIO's I/O ------------------------------------------------------------------------

    def pread(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
              task_size: Optional[int] = None) -> IOFuture:
        """Starts reading `size` bytes (default: all of `buf`) at `file_offset` into `buf`
        (host or GPU memory), in tasks of `task_size` (default: the task_size setting) on
        ferry's workers. ``get()`` on the result returns the bytes read (fewer at end of
        file)."""
        return self._submit("read", buf, size, file_offset, task_size)

    def pwrite(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
               task_size: Optional[int] = None) -> IOFuture:
        """Starts writing `buf` (or its first `size` bytes) at `file_offset`; ``get()`` returns
        the bytes written."""
        return self._submit("write", buf, size, file_offset, task_size)

    def read(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
             task_size: Optional[int] = None) -> int:
        """``pread(...).get()``, as one synchronous request: a request of one task runs in this
        thread (no hand-off to a worker and back, about 20 us of a 1 MiB read); larger ones
        on the workers, as pread's."""
        return int(self._call(_ferry.File.read, "read", buf, size, file_offset, task_size))

    def write(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
              task_size: Optional[int] = None) -> int:
        """``pwrite(...).get()``, as one synchronous request (see ``read``)."""
        return int(self._call(_ferry.File.write, "write", buf, size, file_offset, task_size))

    def _raw_target(self, buf: Any, size: Optional[int], dev_offset: int, op: str) -> Any:
        """`buf`, or its bytes from `dev_offset`: GPU memory only, as KvikIO's raw calls."""
        if not _device_memory(buf):
            raise ValueError("Non-CUDA buffers not supported (KvikIO's raw_read and raw_write "
                             "take GPU memory; read and write take host memory too)")
        dev_offset = operator.index(dev_offset)
        if dev_offset == 0:
            return buf
        address, nbytes, _ = _ferry.buffer_info(buf, op == "read")
        if dev_offset < 0 or dev_offset > nbytes:
            raise ValueError(f"ferry.kvikio: dev_offset {dev_offset} is outside the buffer "
                             f"({nbytes} bytes)")
        left = nbytes - dev_offset
        if size is not None and size > left:
            raise ValueError(f"ferry.kvikio: size {size} from dev_offset {dev_offset} is larger "
                             f"than the buffer ({nbytes} bytes)")
        return _DeviceSpan(buf, address + dev_offset, left, op == "write")

    def _raw(self, op: str, buf: Any, size: Optional[int], file_offset: int,
             dev_offset: int) -> int:
        target = self._raw_target(buf, size, dev_offset, op)
        self._check(op)
        # KvikIO's raw calls are one call in the caller's thread: one task here.
        _, nbytes, _ = _ferry.buffer_info(target, op == "read")
        n = nbytes if size is None else operator.index(size)
        from . import defaults

        task = min(max(n, defaults._MIN_TASK), 64 << 30)
        method = _ferry.File.pread if op == "read" else _ferry.File.pwrite
        return IOFuture(self._in_tasks_of(task, method, target, size, file_offset)).get()

    def raw_read(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
                 dev_offset: int = 0) -> int:
        """Reads into GPU memory (host memory is a ValueError) at `dev_offset` bytes into
        `buf`, as one task; the bytes read."""
        return self._raw("read", buf, size, file_offset, dev_offset)

    def raw_write(self, buf: Any, size: Optional[int] = None, file_offset: int = 0,
                  dev_offset: int = 0) -> int:
        """Writes from GPU memory (host memory is a ValueError), from `dev_offset` bytes into
        `buf`, as one task; the bytes written."""
        return self._raw("write", buf, size, file_offset, dev_offset)

    def _stream_ordered(self, op: str, buf: Any, stream: Any, size: Optional[int],
                        file_offset: int, dev_offset: int) -> "IOFutureStream":
        target = self._raw_target(buf, size, dev_offset, op)
        self._check(op)
        handle = stream_handle(stream)
        start = _ferry.File.read_async if op == "read" else _ferry.File.write_async
        # An IOFuture: the request's error comes out as KvikIO's (a RuntimeError too).
        return IOFutureStream(IOFuture(start(self._file, target, handle, size, file_offset)),
                              stream)

    def raw_read_async(self, buf: Any, raw_stream: Any, size: Optional[int] = None,
                       file_offset: int = 0, dev_offset: int = 0) -> IOFutureStream:
        """Stream-ordered read into GPU memory (`dev_offset` bytes into `buf`) on `raw_stream`
        (a CUstream int): the bytes land after the work queued on the stream before, and the
        work queued after sees them, without blocking this thread or synchronising the stream
        (``ferry.File.read_async``)."""
        return self._stream_ordered("read", buf, raw_stream, size, file_offset, dev_offset)

    def raw_write_async(self, buf: Any, raw_stream: Any, size: Optional[int] = None,
                        file_offset: int = 0, dev_offset: int = 0) -> IOFutureStream:
        """Stream-ordered write from GPU memory on `raw_stream`: it writes what the stream's
        earlier work left in the buffer, and the stream's later work waits for it."""
        return self._stream_ordered("write", buf, raw_stream, size, file_offset, dev_offset)

    def read_async(self, buf: Any, stream: Any = None, size: Optional[int] = None,
                   file_offset: int = 0, dev_offset: int = 0) -> IOFutureStream:
        """``raw_read_async`` taking a stream object (CuPy, PyTorch, ``__cuda_stream__``) or a
        CUstream; None is the legacy default stream."""
        return self.raw_read_async(buf, stream, size, file_offset, dev_offset)

    def write_async(self, buf: Any, stream: Any = None, size: Optional[int] = None,
                    file_offset: int = 0, dev_offset: int = 0) -> IOFutureStream:
        """``raw_write_async`` taking a stream object or a CUstream."""
        return self.raw_write_async(buf, stream, size, file_offset, dev_offset)


# ---- page cache -------------------------------------------------------------------------------

def _open_for(file: Any, who: str) -> tuple[int, bool]:
    """(a descriptor for `file`, whether it is ours to close). `file`: a path (str, PathLike),
    a descriptor, or an object with fileno(); anything else is a ValueError."""
    if isinstance(file, bool):
        raise ValueError(f"{who}: expected a path, a file descriptor or a file object, not bool")
    if isinstance(file, int):
        return file, False
    if isinstance(file, (str, os.PathLike)):
        path = os.fspath(file)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC), True
        except OSError as e:
            code = e.errno or errno.EIO
            raise io_error(code, f"Unable to open file {path!r}: {os.strerror(code)}", path,
                           "open") from None
    if isinstance(file, io.IOBase) or hasattr(file, "fileno"):
        try:
            return int(file.fileno()), False
        except (OSError, ValueError, io.UnsupportedOperation) as e:
            raise ValueError(f"{who}: the file object has no file descriptor ({e})") from None
    raise ValueError(f"{who}: expected a path, a file descriptor or a file object, not "
                     f"{type(file).__name__}")


def _resident_pages(fd: int, size: int) -> int:
    """Pages of the first `size` bytes of `fd` in the page cache, every page looked at (ferry's
    one residency measurement: cachestat, else mincore a window at a time)."""
    r = _ferry.page_cache_residency(fd, 0, size, exact=True)
    if not r.known:
        raise OSError(errno.EIO, f"page-cache residency: {r.why_not}")
    # The resident bytes of a range from offset 0 are whole pages, the last one cut at the size.
    return (r.resident + mmap.PAGESIZE - 1) // mmap.PAGESIZE


def get_page_cache_info(file: Union[PathLike, int, io.IOBase]) -> tuple[int, int]:
    """(pages of `file` in the page cache, pages of the file): a path, a descriptor or a file
    object. A file that does not open is a RuntimeError (also FileNotFoundError...)."""
    fd, ours = _open_for(file, "get_page_cache_info")
    try:
        size = os.fstat(fd).st_size
        total = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        if size == 0:
            return 0, 0
        try:
            return _resident_pages(fd, size), total
        except OSError:
            # A descriptor that cannot be mapped (opened write-only): ask through a read-only one.
            if ours:
                raise
            again = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                return _resident_pages(again, size), total
            finally:
                os.close(again)
    finally:
        if ours:
            os.close(fd)


def drop_file_page_cache(file: Union[PathLike, int, io.IOBase], offset: int = 0,
                         length: int = 0, sync_first: bool = True) -> None:
    """Asks the kernel to drop `file`'s pages from the page cache (posix_fadvise DONTNEED) from
    `offset`, `length` bytes (0: to the end); with `sync_first`, fdatasync first so dirty pages
    can go. Pages only partly inside the range stay. Needs no privileges."""
    offset, length = operator.index(offset), operator.index(length)
    if offset < 0 or length < 0:
        raise ValueError(f"drop_file_page_cache: offset and length must be >= 0, not {offset} "
                         f"and {length}")
    fd, ours = _open_for(file, "drop_file_page_cache")
    try:
        if sync_first:
            os.fdatasync(fd)
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        if ours:
            os.close(fd)


def drop_system_page_cache(reclaim_dentries_and_inodes: bool = True,
                           sync_first: bool = True) -> bool:
    """Drops the whole system's page cache (``vm.drop_caches``: 3, or 1 without dentries and
    inodes), after ``sync`` with `sync_first`. True when it was dropped; False without the
    privilege (unlike KvikIO, ferry does not try ``sudo``)."""
    if sync_first:
        os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3" if reclaim_dentries_and_inodes else "1")
    except OSError:
        return False
    return True


def clear_page_cache(reclaim_dentries_and_inodes: bool = True,
                     clear_dirty_pages: bool = True) -> bool:
    """Deprecated in KvikIO (26.04): ``drop_system_page_cache``."""
    import warnings

    warnings.warn("Use :func:`drop_system_page_cache` instead.", FutureWarning, stacklevel=2)
    return drop_system_page_cache(reclaim_dentries_and_inodes, clear_dirty_pages)
