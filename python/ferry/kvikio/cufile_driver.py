"""``kvikio.cufile_driver``: the cuFile driver, as ferry sees it.

ferry opens cuFile's driver itself, the first time a request needs it, and keeps it open for
the life of the process (closing it under requests in flight would fail them). So
``driver_open()`` opens it now (a RuntimeError where cuFile is missing or does not open, as in
KvikIO) and ``driver_close()`` ends the caller's claim on it: the driver closes when the
process ends. ``get``/``set`` answer where cuFile is present (a RuntimeError naming why where
it is not): ``is_gds_available``, ``major_version`` and ``minor_version`` (of nvidia-fs) are
read; the properties KvikIO sets through ``cuFileDriverSet*`` raise NotImplementedError, as
ferry leaves cuFile's configuration to ``cufile.json`` (``ferry check`` prints what it holds).
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any, Optional, overload

from .. import _ferry
from .defaults import _config_arg

__all__ = ["ConfigContextManager", "driver_close", "driver_open", "get", "initialize",
           "libcufile_version", "set"]

_lock = threading.Lock()
_claims = 0

_READABLE = ("is_gds_available", "major_version", "minor_version")
_NOT_BOUND = ("allow_compat_mode", "per_buffer_cache_size", "poll_mode", "poll_thresh_size",
              "max_device_cache_size", "max_pinned_memory_size")


def _status(open_driver: bool) -> dict[str, Any]:
    status = getattr(_ferry, "cufile_status", None)
    if status is None:
        raise RuntimeError("cuFile is not available: this ferry was built without cuFile "
                           "support")
    result: dict[str, Any] = status(open_driver)
    return result


def _require_cufile(open_driver: bool) -> dict[str, Any]:
    status = _status(open_driver)
    if not status["loaded"]:
        raise RuntimeError(f"cuFile is not available: {status['load_error']}")
    if open_driver and not status["driver_open"]:
        raise RuntimeError(f"cuFile's driver does not open: {status['driver_error_text']}")
    return status


def libcufile_version() -> tuple[int, int]:
    """libcufile's version as (major, minor); (0, 0) where it does not load or is older than
    1.8 (as KvikIO)."""
    try:
        status = _status(False)
    except RuntimeError:
        return (0, 0)
    v = int(status.get("version") or 0)
    return (v // 1000, (v % 1000) // 10)


def driver_open() -> None:
    """Opens cuFile's driver now (ferry would open it at the first request that needs it);
    RuntimeError where cuFile is missing or its driver does not open. Each call is one claim,
    ended by ``driver_close()``."""
    global _claims
    _require_cufile(True)
    with _lock:
        _claims += 1


def driver_close() -> None:
    """Ends one ``driver_open()`` claim; RuntimeError without one. The driver itself stays open
    for ferry's requests until the process ends."""
    global _claims
    with _lock:
        if _claims == 0:
            raise RuntimeError("ferry.kvikio.cufile_driver.driver_close: no driver_open() to "
                               "close")
        _claims -= 1


def initialize() -> None:
    """``driver_open()`` now and ``driver_close()`` at exit."""
    driver_open()
    atexit.register(driver_close)


def _nvfs_version() -> Optional[tuple[int, int]]:
    """nvidia-fs's version from /proc/driver/nvidia-fs/version ("version: 2.17" or "2.17")."""
    try:
        with open("/proc/driver/nvidia-fs/version") as f:
            line = f.readline()
    except OSError:
        return None
    text = line.split(":", 1)[-1].strip()
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def _get(name: str) -> Any:
    if not isinstance(name, str) or name not in _READABLE + _NOT_BOUND:
        raise KeyError(f"kvikio.cufile_driver has no property {name!r}; known: "
                       f"{', '.join(_READABLE + _NOT_BOUND)}")
    if name in _NOT_BOUND:
        raise NotImplementedError(f"kvikio.cufile_driver {name!r}: ferry does not call "
                                  "cuFileDriverGetProperties/cuFileDriverSet*; cuFile reads it "
                                  "from cufile.json (CUFILE_ENV_PATH_JSON), which `ferry check` "
                                  "prints")
    _require_cufile(True)
    version = _nvfs_version()
    if name == "is_gds_available":
        return os.path.isdir("/proc/driver/nvidia-fs")
    if version is None:
        return 0
    return version[0] if name == "major_version" else version[1]


class ConfigContextManager:
    """What ``set`` returns (KvikIO's shape); every settable property raises
    NotImplementedError in ferry, so none is ever changed."""

    def __init__(self, config: dict[str, Any]) -> None:
        for name in config:
            if name in _READABLE:
                raise KeyError(f"kvikio.cufile_driver {name!r} is read-only")
            _get(name)  # KeyError or NotImplementedError

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@overload
def set(config: dict[str, Any], /) -> ConfigContextManager: ...
@overload
def set(key: str, value: Any, /) -> ConfigContextManager: ...
def set(*config: Any) -> ConfigContextManager:  # noqa: A001 (KvikIO's name)
    """KvikIO's setter of cuFile driver properties: NotImplementedError naming the property
    (ferry leaves them to cufile.json); KeyError for names KvikIO does not have."""
    return ConfigContextManager(_config_arg("cufile_driver", config))


def get(config_name: str) -> Any:
    """``is_gds_available`` (nvidia-fs is loaded), ``major_version``/``minor_version`` (of
    nvidia-fs; 0 where unknown); RuntimeError where cuFile is missing or its driver does not
    open; NotImplementedError for the properties ferry does not read."""
    return _get(config_name)
