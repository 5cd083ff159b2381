"""KvikIO's enums, with KvikIO's values."""

from __future__ import annotations

import enum


class CompatMode(enum.IntEnum):
    """KvikIO's compatibility mode, which is ferry's ``compat_mode``: ``ON`` never calls cuFile
    (ferry's POSIX path), ``OFF`` always calls cuFile and fails rather than fall back, ``AUTO``
    lets ferry decide per request (cuFile where its accelerated path can serve the range and
    the range is not in the page cache, else ferry's POSIX path, with the reason in the
    route report)."""

    OFF = 0
    ON = 1
    AUTO = 2


class RemoteIOBackend(enum.IntEnum):
    """KvikIO's remote I/O backends. ferry reads local files only: ``RemoteFile`` and the
    ``remote_io_*`` settings raise NotImplementedError."""

    EASY_THREADPOOL = 0
    MULTI_POLL = 1
