"""KvikIO reports I/O failures as ``RuntimeError``; ferry as ``OSError`` subclasses
(``ferry.IoError``, ``FileNotFoundError``...). ``ferry.kvikio`` raises a class that is both: the
ferry class it came from and ``RuntimeError``, so ``except RuntimeError`` (KvikIO code) and
``except FileNotFoundError`` or ``except ferry.IoError`` (ferry code) catch the same exception.
Such exceptions pickle and compare equal like ferry's own."""

from __future__ import annotations

import errno as errno_codes
import threading
from typing import Any, Optional

from .. import _errors as ferry_errors

_lock = threading.Lock()
_mixed: dict[type, type] = {}  # ferry class -> ferry class + RuntimeError
_bases: dict[type, type] = {}  # the reverse


def runtime_class(cls: type) -> type:
    """`cls` (a ferry exception class) combined with ``RuntimeError``; `cls` itself when it
    already is one (``ferry.CudaError``)."""
    if issubclass(cls, RuntimeError):
        return cls
    with _lock:
        mixed = _mixed.get(cls)
        if mixed is None:
            mixed = type(cls.__name__, (cls, RuntimeError), {
                "__module__": "ferry.kvikio",
                "__doc__": f"{cls.__module__}.{cls.__qualname__} as KvikIO raises it: also a "
                           "RuntimeError.",
                "__reduce__": _reduce,
            })
            _mixed[cls] = mixed
            _bases[mixed] = cls
        return mixed


def _reduce(self: Any) -> tuple[Any, ...]:
    base = _bases[type(self)]
    key: Any = base
    if issubclass(base, ferry_errors.IoError) and base in ferry_errors._io_classes.values():
        key = self.errno  # the per-errno classes are made at run time
    return (_rebuild, (key, self.args, self._attrs()))


def _rebuild(key: Any, args: tuple[Any, ...], attrs: dict[str, Any]) -> BaseException:
    """Unpickles an exception made by ``_reduce``."""
    base = ferry_errors._io_class(key) if isinstance(key, int) else key
    exc: BaseException = runtime_class(base)(*args)
    for name, value in attrs.items():
        setattr(exc, name, value)
    return exc


def kvikio_error(e: BaseException, message: Optional[str] = None) -> BaseException:
    """ferry's exception `e` as ``ferry.kvikio`` raises it: the same class plus
    ``RuntimeError``, the same attributes (errno, filename, op, offset, bytes_done...), and
    `message` in place of the text when given. Other exceptions are returned as they are."""
    if not isinstance(e, ferry_errors.Error):
        return e
    if isinstance(e, RuntimeError) and message is None:
        return e
    cls = runtime_class(type(e))
    if message is None:
        args: tuple[Any, ...] = e.args
    elif isinstance(e, OSError):
        args = (e.errno, message)
    else:
        args = (message,)
    new: BaseException = cls(*args)
    for name, value in e._attrs().items():
        setattr(new, name, value)
    return new


def io_error(code: int, message: str, path: str, op: str) -> BaseException:
    """A ferry.IoError for `code` (the errno's own subclass), as ``ferry.kvikio`` raises it."""
    e = ferry_errors._io_class(code)(code, message)
    e.filename = path
    e.op = op
    return kvikio_error(e)


EPERM = errno_codes.EPERM
