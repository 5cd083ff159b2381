"""``kvikio.remote_file``: KvikIO's ``RemoteFile`` on ferry's remote sources (HTTP, HTTPS and S3
through libcurl, docs/remote.md). WebHDFS is not supported. Reads take host or GPU memory; the
object is read-only."""

from __future__ import annotations

import enum
from typing import Any, Optional, Sequence

from .. import _ferry
from .. import _errors as ferry_errors
from .._file import File
from ._errors import kvikio_error
from ._missing import fail
from .cufile import IOFuture


class RemoteEndpointType(enum.IntEnum):
    """KvikIO's endpoint kinds; ``AUTO`` tells them apart by the URL's scheme."""

    AUTO = 0
    S3 = 1
    S3_PUBLIC = 2
    S3_PRESIGNED_URL = 3
    WEBHDFS = 4
    HTTP = 5


def _check_size(file: File, nbytes: Optional[int], url: str) -> None:
    size = file.size
    if nbytes is not None and int(nbytes) != size:
        file.close()
        raise ValueError(f"ferry.kvikio.RemoteFile: nbytes={nbytes} but {url} is {size} B")


class RemoteFile:
    """A remote object opened for reading: ``nbytes()``, ``read``, ``pread`` (host or GPU
    memory), ``close``. Make one with the ``open_*`` class methods, as KvikIO's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("ferry.kvikio.RemoteFile: make one with RemoteFile.open(url), "
                        "open_http, open_s3, open_s3_url or open_s3_presigned_url")

    @classmethod
    def _make(cls, url: str, kind: RemoteEndpointType, nbytes: Optional[int]) -> "RemoteFile":
        self = object.__new__(cls)
        try:
            self._file = File(url, "r")
        except ferry_errors.Error as e:
            raise kvikio_error(e) from None
        self._kind = kind
        _check_size(self._file, nbytes, self._file.path)
        return self

    @classmethod
    def open(cls, url: str, remote_endpoint_type: RemoteEndpointType = RemoteEndpointType.AUTO,
             allow_list: Optional[Sequence[RemoteEndpointType]] = None,
             nbytes: Optional[int] = None) -> "RemoteFile":
        """Opens `url`: s3:// (signed with AWS_* credentials, anonymous without), http:// or
        https:// (a presigned S3 URL among them). `allow_list` limits the kinds accepted."""
        kind = remote_endpoint_type
        if kind == RemoteEndpointType.AUTO:
            lower = url.lower()
            if lower.startswith("s3://"):
                kind = RemoteEndpointType.S3
            elif "x-amz-signature=" in lower:
                kind = RemoteEndpointType.S3_PRESIGNED_URL
            elif lower.startswith(("http://", "https://")):
                kind = RemoteEndpointType.HTTP
            else:
                raise ValueError(f"ferry.kvikio.RemoteFile.open: {url!r} is not an s3://, "
                                 f"http:// or https:// URL")
        if allow_list is not None and kind not in allow_list:
            raise ValueError(f"ferry.kvikio.RemoteFile.open: {kind.name} is not in allow_list")
        if kind == RemoteEndpointType.WEBHDFS:
            fail("kvikio.RemoteFile (WebHDFS)", "ferry reads HTTP, HTTPS and S3 only")
        return cls._make(url, kind, nbytes)

    @classmethod
    def open_http(cls, url: str, nbytes: Optional[int] = None) -> "RemoteFile":
        return cls._make(url, RemoteEndpointType.HTTP, nbytes)

    @classmethod
    def open_s3(cls, bucket_name: str, object_name: str,
                nbytes: Optional[int] = None) -> "RemoteFile":
        return cls._make(f"s3://{bucket_name}/{object_name}", RemoteEndpointType.S3, nbytes)

    @classmethod
    def open_s3_url(cls, url: str, nbytes: Optional[int] = None) -> "RemoteFile":
        """An s3:// URL (signed); an https:// URL is read as given (anonymous or presigned)."""
        return cls._make(url, RemoteEndpointType.S3, nbytes)

    @classmethod
    def open_s3_public(cls, url: str, nbytes: Optional[int] = None) -> "RemoteFile":
        return cls._make(url, RemoteEndpointType.S3_PUBLIC, nbytes)

    @classmethod
    def open_s3_presigned_url(cls, presigned_url: str,
                              nbytes: Optional[int] = None) -> "RemoteFile":
        return cls._make(presigned_url, RemoteEndpointType.S3_PRESIGNED_URL, nbytes)

    @classmethod
    def open_webhdfs(cls, *args: Any, **kwargs: Any) -> "RemoteFile":
        fail("kvikio.RemoteFile.open_webhdfs", "ferry reads HTTP, HTTPS and S3 only")

    def __enter__(self) -> "RemoteFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def remote_endpoint_type(self) -> RemoteEndpointType:
        return self._kind

    def nbytes(self) -> int:
        """The object's size, learned when it was opened."""
        return self._file.size

    def pread(self, buf: Any, size: Optional[int] = None, file_offset: int = 0) -> IOFuture:
        """Starts reading `size` bytes (default: all of `buf`) at `file_offset` into `buf` (host
        or GPU memory): ranged GETs on ferry's workers."""
        try:
            return IOFuture(_ferry.File.pread(self._file, buf, size, file_offset))
        except ferry_errors.Error as e:
            raise kvikio_error(e) from None

    def read(self, buf: Any, size: Optional[int] = None, file_offset: int = 0) -> int:
        """``pread(...).get()``."""
        return self.pread(buf, size, file_offset).get()


def is_remote_file_available() -> bool:
    """Whether libcurl could be loaded (remote sources need it)."""
    return bool(_ferry.remote_support()[0])
