"""``kvikio.defaults``: KvikIO's settings, kept in ferry's settings.

    kvikio.defaults.get("num_threads")
    kvikio.defaults.set("task_size", 1 << 20)            # process-wide, as in KvikIO
    with kvikio.defaults.set({"compat_mode": kvikio.CompatMode.ON, "num_threads": 16}):
        ...                                              # the old values come back on exit

The values are ferry's own (``ferry.settings``): ``num_threads`` sets both of ferry's thread
counts (``nthreads`` for GPU memory and ``host_nthreads`` for host memory, as KvikIO has one
pool) and reads ``nthreads``. As in KvikIO, ``set`` changes the process-wide settings at once
and its ``with`` block restores the previous ones on exit (``ferry.settings(...)`` scopes, by
contrast, change one thread's).

ferry's limits are narrower than KvikIO's in two places, both without effect on the bytes
moved: a ``task_size`` or ``bounce_buffer_size`` below 4 KiB runs with 4 KiB (a ``LimitWarning``
says so, and ``get`` returns the value set), and ``gds_threshold=0`` runs as 1 (the same
behaviour: no request is smaller than one byte). Values above ferry's limits (a ``task_size``
over 64 GiB, over 256 threads, a bounce buffer over 1 GiB) are refused with
``ferry.SettingError`` (a ValueError). The ``http_*`` settings are ferry's remote policy
(``ferry::set_remote_policy``), read when a remote object is opened, by ``RemoteFile`` and every
other way in alike: ``http_max_attempts`` counts the first GET (1 to 101), ``http_status_codes``
are the answers retried (resets and stalls are retried too), and ``http_timeout`` bounds each
request in all, as KvikIO's does (1 to 86400 s). Until one is set, ``get`` says what ferry does:
FERRY_REMOTE_RETRIES, FERRY_REMOTE_DEADLINE, KvikIO's KVIKIO_HTTP_* variables, or ferry's
defaults (9 attempts, no deadline: 0, 429 500 502 503 504; docs/remote.md). KvikIO's
settings for what ferry does not do raise NotImplementedError naming the setting.
"""

from __future__ import annotations

import operator
import os
import threading
import warnings
from typing import Any, Callable, Optional, overload

from .. import _ferry
from .._errors import SettingError
from ._enums import CompatMode
from .utils import kvikio_deprecation_notice

__all__ = ["ConfigContextManager", "LimitWarning", "get", "is_compat_mode_preferred", "set"]


class LimitWarning(UserWarning):
    """A KvikIO setting below ferry's smallest value: ferry uses its smallest value instead."""


_MIN_TASK = 4 << 10    # ferry's kMinTaskSize
_MIN_BOUNCE = 4 << 10  # ferry's kMinBounceSize

_lock = threading.RLock()
# name -> (value set through ferry.kvikio, the value ferry runs with), where they differ; `get`
# returns the first while ferry's setting still holds the second.
_asked: dict[str, tuple[int, int]] = {}

_NOT_IMPLEMENTED = {
    "auto_direct_io_read": "ferry reads cold ranges with O_DIRECT by itself in compat_mode auto "
                           "and says so in the route report; ferry.open(path, direct=True) asks "
                           "for O_DIRECT on every task",
    "auto_direct_io_read_overread": "ferry reads unaligned O_DIRECT ranges through its own "
                                    "aligned staging",
    "auto_direct_io_write": "ferry writes through the page cache; ferry.open(path, 'w', "
                            "direct=True) asks for O_DIRECT",
    "thread_pool_per_block_device": "ferry has one pool of workers per runtime "
                                    "(ferry.Runtime in C++)",
    "num_bounce_buffers_per_cache": "ferry keeps two staging buffers per worker",
    "remote_io_backend": "ferry's RemoteFile reads through its own workers (docs/remote.md)",
    "remote_io_num_reactors": "ferry's RemoteFile reads through its own workers (docs/remote.md)",
    "remote_io_reactor_dispatch": "ferry's RemoteFile reads through its own workers (docs/remote.md)",
    "remote_io_max_concurrent_requests": "ferry's RemoteFile reads through its own workers (docs/remote.md)",
    "mmap_task_size": "ferry has no Mmap",
}


class _Change:
    """What setting one property does: ferry settings (as text), values kept here, warnings."""

    def __init__(self) -> None:
        self.ferry: dict[str, str] = {}
        self.asked: dict[str, Optional[tuple[int, int]]] = {}
        # Fields of ferry's remote policy (ferry._ferry.set_remote_policy's keywords).
        self.remote: dict[str, Any] = {}
        self.warnings: list[str] = []


def _integer(value: Any, name: str) -> int:
    """`value` as an int; TypeError naming the setting for what is not an integer."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"kvikio.defaults: {name} must be an integer, not "
                        f"{type(value).__name__}") from None


def _unsigned(value: Any, name: str, ctype: str = "size_t") -> int:
    """KvikIO's conversion of a setting to an unsigned C integer: TypeError for what is not an
    integer, OverflowError for a negative one."""
    n = _integer(value, name)
    if n < 0:
        raise OverflowError(f"can't convert negative value to {ctype} ({name}={n})")
    return n


def _compat_mode(value: Any) -> CompatMode:
    if isinstance(value, CompatMode):
        return value
    if isinstance(value, bool):  # KvikIO's old API: True enables compatibility mode
        return CompatMode.ON if value else CompatMode.OFF
    if isinstance(value, int) and value in (0, 1, 2):
        return CompatMode(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("on", "true", "yes", "1"):
            return CompatMode.ON
        if text in ("off", "false", "no", "0"):
            return CompatMode.OFF
        if text == "auto":
            return CompatMode.AUTO
        raise ValueError(f"Unknown compatibility mode: {value!r} (ON, OFF or AUTO)")
    raise TypeError(f"kvikio.defaults: compat_mode must be a kvikio.CompatMode, not "
                    f"{type(value).__name__}")


def _floored(c: _Change, name: str, n: int, floor: int, why: str) -> None:
    """Sets ferry's `name` to `n`, or to `floor` when `n` is below it (recording `n` for get)."""
    ferry_value = max(n, floor)
    c.ferry[name] = str(ferry_value)
    c.asked[name] = (n, ferry_value) if ferry_value != n else None
    if why and n < floor:
        c.warnings.append(f"ferry.kvikio: {name}={n} is below ferry's smallest {name} "
                          f"({floor} B, {why}); ferry runs with {floor}. The bytes moved are "
                          "the same")


def _set_compat_mode(c: _Change, value: Any) -> None:
    c.ferry["compat_mode"] = _compat_mode(value).name.lower()


def _set_num_threads(c: _Change, value: Any) -> None:
    n = _unsigned(value, "num_threads", "unsigned int")
    if n == 0:
        raise ValueError("number of threads must be a positive integer")
    # KvikIO has one pool; ferry has one for GPU memory and one for host memory: both.
    c.ferry["nthreads"] = c.ferry["host_nthreads"] = str(n)


def _set_task_size(c: _Change, value: Any) -> None:
    n = _unsigned(value, "task_size")
    if n == 0:
        raise ValueError("task size must be a positive integer")
    _floored(c, "task_size", n, _MIN_TASK, "a request keeps a few bytes per task, and 4 KiB is "
             "the smallest O_DIRECT unit")


def _set_gds_threshold(c: _Change, value: Any) -> None:
    n = _unsigned(value, "gds_threshold")
    _floored(c, "gds_threshold", n, 1, "")  # 0 and 1 route every request alike


def _set_bounce_buffer_size(c: _Change, value: Any) -> None:
    n = _unsigned(value, "bounce_buffer_size")
    if n == 0:
        raise ValueError("size of the bounce buffer must be a positive integer")
    _floored(c, "bounce_buffer_size", n, _MIN_BOUNCE, "each worker pins two")


def _beyond(name: str, value: Any, words: str) -> SettingError:
    e = SettingError(f"kvikio.defaults: {name}={value!r}: {words}")
    e.setting, e.value = name, str(value)
    return e


def _set_http_max_attempts(c: _Change, value: Any) -> None:
    n = _unsigned(value, "http_max_attempts")
    if n == 0:
        raise ValueError("attempts must be a positive integer")
    if n > 101:
        raise _beyond("http_max_attempts", n, "ferry makes at most 101 attempts (100 retries)")
    c.remote["retries"] = n - 1


def _set_http_status_codes(c: _Change, value: Any) -> None:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"kvikio.defaults: http_status_codes must be a list of int, not "
                        f"{type(value).__name__}")
    codes = []
    for code in value:
        if isinstance(code, bool) or not isinstance(code, int):
            raise TypeError(f"kvikio.defaults: http_status_codes must be a list of int, not "
                            f"one holding {type(code).__name__} {code!r}")
        if not 100 <= code <= 599:
            raise _beyond("http_status_codes", code, "an HTTP status is 100 to 599")
        codes.append(code)
    c.remote["retry_statuses"] = codes


def _set_http_timeout(c: _Change, value: Any) -> None:
    n = _integer(value, "http_timeout")
    if n <= 0:
        raise ValueError("timeout_seconds must be a positive integer")
    if n > 86400:
        raise _beyond("http_timeout", n, "ferry bounds a request at most at 86400 s")
    c.remote["request_seconds"] = n


def _ferry_value(name: str) -> int:
    value = _ferry.get_settings()[name]
    with _lock:
        asked = _asked.get(name)
    if asked is not None and asked[1] == value:
        return asked[0]
    return int(value)


_SETTERS: dict[str, Callable[[_Change, Any], None]] = {
    "compat_mode": _set_compat_mode,
    "num_threads": _set_num_threads,
    "task_size": _set_task_size,
    "gds_threshold": _set_gds_threshold,
    "bounce_buffer_size": _set_bounce_buffer_size,
    "http_max_attempts": _set_http_max_attempts,
    "http_status_codes": _set_http_status_codes,
    "http_timeout": _set_http_timeout,
}

_GETTERS: dict[str, Callable[[], Any]] = {
    "compat_mode": lambda: CompatMode[str(_ferry.get_settings()["compat_mode"]).upper()],
    "num_threads": lambda: int(_ferry.get_settings()["nthreads"]),
    "task_size": lambda: _ferry_value("task_size"),
    "gds_threshold": lambda: _ferry_value("gds_threshold"),
    "bounce_buffer_size": lambda: _ferry_value("bounce_buffer_size"),
    "http_max_attempts": lambda: int(_ferry.effective_remote_policy()["retries"]) + 1,
    "http_status_codes": lambda: list(_ferry.effective_remote_policy()["retry_statuses"]),
    "http_timeout": lambda: int(_ferry.effective_remote_policy()["request_seconds"]),
}

_ALIASES = {"thread_pool_nthreads": "num_threads"}  # KvikIO's C++ name


def _name(name: Any) -> str:
    if not isinstance(name, str):
        raise KeyError(name)
    name = _ALIASES.get(name, name)
    if name in _NOT_IMPLEMENTED:
        raise NotImplementedError(f"kvikio.defaults {name!r}: ferry.kvikio does not implement "
                                  f"it: {_NOT_IMPLEMENTED[name]}")
    if name not in _SETTERS:
        raise KeyError(f"kvikio.defaults has no setting {name!r}; known: "
                       f"{', '.join(_SETTERS)}")
    return name


def _plan(config: dict[str, Any]) -> _Change:
    """Every change `config` makes, checked before any is made (a bad value changes nothing)."""
    change = _Change()
    for name, value in config.items():
        _SETTERS[_name(name)](change, value)
    return change


def _snapshot(change: _Change) -> _Change:
    """The current values of what `change` changes: applying it undoes `change`."""
    old = _Change()
    current = _ferry.get_settings()
    for key in change.ferry:
        old.ferry[key] = str(current[key])
    with _lock:
        for key in change.asked:
            old.asked[key] = _asked.get(key)
        if change.remote:
            old.remote = dict(_ferry.remote_policy())  # all fields: None where unset
    return old


def _apply(change: _Change, warn: bool) -> None:
    with _lock:
        if change.ferry:
            _ferry.set_settings(change.ferry)
        for key, asked in change.asked.items():
            if asked is None:
                _asked.pop(key, None)
            else:
                _asked[key] = asked
        if change.remote:
            _ferry.set_remote_policy(**{**_ferry.remote_policy(), **change.remote})
    if warn:
        for text in change.warnings:
            warnings.warn(text, LimitWarning, stacklevel=4)


class ConfigContextManager:
    """What ``set`` returns: the settings are changed when it is made (process-wide); used in a
    ``with`` block, the previous values come back when the block ends."""

    def __init__(self, config: dict[str, Any]) -> None:
        change = _plan(config)
        self._old = _snapshot(change)
        _apply(change, warn=True)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        _apply(self._old, warn=False)


def _config_arg(module: str, args: tuple[Any, ...]) -> dict[str, Any]:
    """The settings of KvikIO's ``MODULE.set(config: dict)`` or ``MODULE.set(key, value)`` as one
    dict; ValueError with KvikIO's usage words for any other arguments."""
    if len(args) == 1 and isinstance(args[0], dict):
        return args[0]
    if len(args) == 2 and isinstance(args[0], str):
        return {args[0]: args[1]}
    raise ValueError(f"Valid arguments are kvikio.{module}.set(config: dict) or "
                     f"kvikio.{module}.set(key: str, value: Any)")


@overload
def set(config: dict[str, Any], /) -> ConfigContextManager: ...
@overload
def set(key: str, value: Any, /) -> ConfigContextManager: ...
def set(*config: Any) -> ConfigContextManager:  # noqa: A001 (KvikIO's name)
    """Sets KvikIO settings: ``set({"num_threads": 16, "task_size": 1 << 20})`` or
    ``set("num_threads", 16)``, process-wide at once; in a ``with`` block they are restored when
    it ends. Names: compat_mode, num_threads, task_size, gds_threshold, bounce_buffer_size,
    http_max_attempts, http_status_codes, http_timeout. An unknown name is a KeyError; a name
    KvikIO has for something ferry does not do is a NotImplementedError."""
    return ConfigContextManager(_config_arg("defaults", config))


def get(config_name: str) -> Any:
    """The value of a KvikIO setting (names as for ``set``), as this thread sees ferry's."""
    return _GETTERS[_name(config_name)]()


def _cufile_accelerated() -> bool:
    """Whether cuFile's accelerated path may serve requests: libcufile loads and nvidia-fs is
    loaded (ferry's auto mode sends nothing to cuFile otherwise)."""
    status = getattr(_ferry, "cufile_status", None)
    if status is None:
        return False
    try:
        loaded = bool(status(False)["loaded"])
    except Exception:
        return False
    return loaded and os.path.isdir("/proc/driver/nvidia-fs")


def is_compat_mode_preferred() -> bool:
    """Whether requests are expected to take the POSIX path: compat_mode ON, or AUTO on a
    machine where cuFile's accelerated path is not available (ferry's auto mode then never
    calls cuFile)."""
    mode = get("compat_mode")
    if mode == CompatMode.AUTO:
        return not _cufile_accelerated()
    return bool(mode == CompatMode.ON)


# KvikIO's older functions, deprecated there since 25.04 (a FutureWarning, as there). The
# setters return the context manager, so the older `with kvikio.defaults.set_num_threads(n):`
# restores the value too.
_USE_GET = "Use :meth:`kvikio.defaults.get()` instead."
_USE_SET = "Use :meth:`kvikio.defaults.set()` instead."


def _getter(name: str, doc: str) -> Callable[[], Any]:
    @kvikio_deprecation_notice(_USE_GET, since="25.04")
    def getter() -> Any:
        return get(name)

    getter.__name__ = getter.__qualname__ = name
    getter.__doc__ = doc + (getter.__doc__ or "")
    return getter


compat_mode = _getter("compat_mode", "The compatibility mode.")
num_threads = get_num_threads = _getter("num_threads", "The number of threads (ferry's nthreads).")
task_size = _getter("task_size", "The task size in bytes.")
gds_threshold = _getter("gds_threshold", "The GDS threshold in bytes.")
bounce_buffer_size = _getter("bounce_buffer_size", "The bounce buffer size in bytes.")
http_max_attempts = _getter("http_max_attempts", "The attempts per remote read (the first too).")
http_status_codes = _getter("http_status_codes", "The HTTP status codes retried.")


def _setter(name: str) -> Callable[[Any], ConfigContextManager]:
    @kvikio_deprecation_notice(_USE_SET, since="25.04")
    def setter(value: Any) -> ConfigContextManager:
        return ConfigContextManager({name: value})

    setter.__name__ = setter.__qualname__ = f"set_{name}"
    setter.__doc__ = f"Sets {name} (a context manager, as ``set``).\n\n" + (setter.__doc__ or "")
    return setter


compat_mode_reset = set_compat_mode = _setter("compat_mode")
num_threads_reset = set_num_threads = _setter("num_threads")
task_size_reset = set_task_size = _setter("task_size")
gds_threshold_reset = set_gds_threshold = _setter("gds_threshold")
bounce_buffer_size_reset = set_bounce_buffer_size = _setter("bounce_buffer_size")
http_max_attempts_reset = set_http_max_attempts = _setter("http_max_attempts")
http_status_codes_reset = set_http_status_codes = _setter("http_status_codes")
