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
# (ferry class, the builtins added) -> the class that is all of them, and the reverse.
_mixed: dict[tuple[type, tuple[type, ...]], type] = {}
_bases: dict[type, tuple[type, tuple[type, ...]]] = {}


def runtime_class(cls: type, also: tuple[type, ...] = ()) -> type:
    """`cls` (a ferry exception class) combined with ``RuntimeError`` and the builtins `also`
    (``OverflowError`` where KvikIO raises that); `cls` itself when it already is all of them
    (``ferry.CudaError``)."""
    cls = _bases.get(cls, (cls, ()))[0]  # from the ferry class, never from a mixed one
    extras = tuple(t for t in dict.fromkeys((RuntimeError, *also)) if not issubclass(cls, t))
    if not extras:
        return cls
    with _lock:
        mixed = _mixed.get((cls, extras))
        if mixed is None:
            names = " and ".join(t.__name__ for t in extras)
            mixed = type(cls.__name__, (cls, *extras), {
                "__module__": "ferry.kvikio",
                "__doc__": f"{cls.__module__}.{cls.__qualname__} as KvikIO raises it: also "
                           f"{names}.",
                "__reduce__": _reduce,
            })
            _mixed[(cls, extras)] = mixed
            _bases[mixed] = (cls, extras)
        return mixed


def _reduce(self: Any) -> tuple[Any, ...]:
    base, extras = _bases[type(self)]
    key: Any = base
    if issubclass(base, ferry_errors.IoError) and base in ferry_errors._io_classes.values():
        key = self.errno  # the per-errno classes are made at run time
    return (_rebuild, (key, self.args, self._attrs(), extras))


def _rebuild(key: Any, args: tuple[Any, ...], attrs: dict[str, Any],
             also: tuple[type, ...] = ()) -> BaseException:
    """Unpickles an exception made by ``_reduce``."""
    base = ferry_errors._io_class(key) if isinstance(key, int) else key
    exc: BaseException = runtime_class(base, also)(*args)
    for name, value in attrs.items():
        setattr(exc, name, value)
    return exc


def kvikio_error(e: BaseException, message: Optional[str] = None,
                 also: tuple[type, ...] = ()) -> BaseException:
    """ferry's exception `e` as ``ferry.kvikio`` raises it: the same class plus
    ``RuntimeError`` (and the builtins `also`), the same attributes (errno, filename, op,
    offset, bytes_done...), and `message` in place of the text when given. Other exceptions are
    returned as they are."""
    if not isinstance(e, ferry_errors.Error):
        return e
    cls = runtime_class(type(e), also)
    if type(e) is cls and message is None:
        return e
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
