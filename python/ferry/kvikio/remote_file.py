"""``kvikio.remote_file``: ferry reads local files only. ``RemoteFile`` raises
NotImplementedError when used; ``is_remote_file_available()`` is False."""

from __future__ import annotations

from typing import Any, NoReturn

from ._missing import fail, module_getattr

_WHY = "ferry reads local files only: no HTTP, S3 or WebHDFS"


class RemoteFile:
    """KvikIO's remote file (HTTP, S3, WebHDFS): not in ferry; every way to make one raises
    NotImplementedError."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        fail("kvikio.RemoteFile", _WHY)

    @classmethod
    def open(cls, *args: Any, **kwargs: Any) -> NoReturn:
        fail("kvikio.RemoteFile.open", _WHY)

    @classmethod
    def open_http(cls, *args: Any, **kwargs: Any) -> NoReturn:
        fail("kvikio.RemoteFile.open_http", _WHY)

    @classmethod
    def open_s3(cls, *args: Any, **kwargs: Any) -> NoReturn:
        fail("kvikio.RemoteFile.open_s3", _WHY)

    @classmethod
    def open_s3_url(cls, *args: Any, **kwargs: Any) -> NoReturn:
        fail("kvikio.RemoteFile.open_s3_url", _WHY)

    @classmethod
    def open_s3_presigned_url(cls, *args: Any, **kwargs: Any) -> NoReturn:
        fail("kvikio.RemoteFile.open_s3_presigned_url", _WHY)

    @classmethod
    def open_webhdfs(cls, *args: Any, **kwargs: Any) -> NoReturn:
        fail("kvikio.RemoteFile.open_webhdfs", _WHY)


def is_remote_file_available() -> bool:
    """False: ferry has no remote files."""
    return False


__getattr__ = module_getattr("kvikio.remote_file", _WHY)
