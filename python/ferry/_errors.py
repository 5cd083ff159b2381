"""ferry's exceptions. Each mixes :class:`ferry.Error` with the builtin that Python code already
catches: I/O errors are ``OSError`` (and the errno's own subclass, e.g. ``FileNotFoundError``),
bad settings ``ValueError``, CUDA failures ``RuntimeError``. Messages are the C++ ones."""

from __future__ import annotations

from typing import Any


class Error(Exception):
    """Base of every error ferry raises. ferry's exceptions pickle (they cross process
    boundaries, e.g. from a ``ProcessPoolExecutor`` worker) and compare equal when their class,
    arguments and attributes are equal."""

    def _attrs(self) -> dict[str, Any]:
        attrs = dict(vars(self))
        if isinstance(self, OSError) and self.filename is not None:
            attrs["filename"] = self.filename
        return attrs

    def __reduce__(self) -> tuple[Any, ...]:
        # The per-errno classes are made at run time: name the errno, not the class.
        key: Any = type(self)
        if isinstance(self, IoError) and type(self) in _io_classes.values():
            key = self.errno
        return (_rebuild, (key, self.args, self._attrs()))

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return NotImplemented
        assert isinstance(other, Error)
        return self.args == other.args and self._attrs() == other._attrs()

    def __hash__(self) -> int:
        return hash((type(self), self.args))


class IoError(Error, OSError):
    """A failed system call on a file: ``errno``, ``filename``, ``op``, ``offset``, ``length``
    and ``bytes_done`` (what moved before the failure)."""

    op: str = ""
    offset: int = 0
    length: int = 0
    bytes_done: int = 0

    def __str__(self) -> str:
        return f"[Errno {self.errno}] {self.strerror}"


class RouteError(Error, OSError):
    """A request refused by strict mode (``require``); ``report`` is its route report, when the
    request got far enough to have one."""

    report: Any = None


class CudaError(Error, RuntimeError):
    """A CUDA driver failure, or no driver (``code`` 0)."""

    code: int = 0


class SettingError(Error, ValueError):
    """A setting value that does not parse; ``setting`` and ``value`` name it."""

    setting: str = ""
    value: str = ""


for _cls in (Error, IoError, RouteError, CudaError, SettingError):
    _cls.__module__ = "ferry"

_io_classes: dict[type, type] = {}


def _io_class(code: int) -> type:
    """IoError combined with the OSError subclass Python picks for `code` (FileNotFoundError
    for ENOENT...), so that both ``except ferry.IoError`` and ``except FileNotFoundError`` work."""
    builtin = type(OSError(code, ""))
    if builtin is OSError:
        return IoError
    if builtin not in _io_classes:
        _io_classes[builtin] = type(builtin.__name__, (IoError, builtin), {"__module__": "ferry"})
    return _io_classes[builtin]


def _rebuild(key: Any, args: tuple[Any, ...], attrs: dict[str, Any]) -> Exception:
    """Unpickles an exception made by ``Error.__reduce__``."""
    cls = _io_class(key) if isinstance(key, int) else key
    exc: Exception = cls(*args)
    for name, value in attrs.items():
        setattr(exc, name, value)
    return exc


def from_cpp(kind: str, message: str, **attrs: Any) -> Exception:
    """Builds the Python exception for a C++ one (called by the extension)."""
    exc: Exception
    if kind == "io":
        code = attrs.pop("errno")
        exc = _io_class(code)(code, message)
    elif kind == "route":
        exc = RouteError(message)
    elif kind == "cuda":
        exc = CudaError(message)
    elif kind == "setting":
        exc = SettingError(message)
    else:
        exc = Error(message)
    for name, value in attrs.items():
        setattr(exc, name, value)
    return exc
