"""``kvikio.remote_file``: KvikIO's ``RemoteFile`` on ferry's remote sources (HTTP, HTTPS and S3
through libcurl, docs/remote.md). WebHDFS is not supported. Reads take host or GPU memory; the
object is read-only."""

from __future__ import annotations

import enum
import operator
import re
import urllib.parse
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


def _shown(url: str) -> str:
    """`url` as ferry's reports show it (ferry::shown_path, the one place a URL becomes text):
    the query and fragment as ``?...``, no ``user:password@``."""
    return _ferry.shown_path(url)


def _known_size(file: File, nbytes: Optional[int], url: str) -> int:
    """The size the RemoteFile reports: `nbytes` where given (KvikIO takes it as the file's
    size), the object's own otherwise. ferry learns the object's size at open all the same (its
    HEAD also brings the ETag every ranged GET is checked against), so an `nbytes` beyond the
    object is refused here, not left to fail at the first read."""
    size = file.size
    if nbytes is None:
        return size
    n = operator.index(nbytes)
    if n < 0 or n > size:
        file.close()
        raise ValueError(f"ferry.kvikio.RemoteFile: nbytes={nbytes} but {_shown(url)} is "
                         f"{size} B")
    return n


class _RemoteIOFuture(IOFuture):
    """``IOFuture`` of a remote read: a server that answered a ranged GET with the whole object
    is ``OverflowError`` ("maybe the server doesn't support file ranges?"), as KvikIO's; also
    the ferry class and ``RuntimeError``, as every ferry.kvikio error."""

    def _error(self, e: BaseException) -> BaseException:
        e = kvikio_error(e)
        if (isinstance(e, OSError) and not isinstance(e, OverflowError)
                and _NO_RANGES in str(e)):
            words = e.strerror if e.strerror is not None else str(e)
            return kvikio_error(e, f"maybe the server doesn't support file ranges? [{words}]",
                                also=(OverflowError,))
        return e


_NO_RANGES = "it ignored the Range header"  # ferry's words (src/remote/http_get.cc)


_KIND_NAMES = {
    RemoteEndpointType.AUTO: "AUTO", RemoteEndpointType.S3: "S3",
    RemoteEndpointType.S3_PUBLIC: "S3 public",
    RemoteEndpointType.S3_PRESIGNED_URL: "S3 with presigned URL",
    RemoteEndpointType.WEBHDFS: "WebHDFS", RemoteEndpointType.HTTP: "HTTP",
}
_DEFAULT_ALLOW_LIST = (RemoteEndpointType.S3, RemoteEndpointType.S3_PUBLIC,
                       RemoteEndpointType.S3_PRESIGNED_URL, RemoteEndpointType.WEBHDFS,
                       RemoteEndpointType.HTTP)
# KvikIO's AWS S3 https URL forms (remote_handle.cpp, url_has_aws_s3_http_format).
_AWS_S3_HTTP = [re.compile(p, re.IGNORECASE) for p in (
    r"https?://[^/]+\.s3\.[^.]+\.amazonaws\.com/.+",       # virtual host, region
    r"https?://s3\.[^.]+\.amazonaws\.com/[^/]+/.+",         # path style, region
    r"https?://[^/]+\.s3\.amazonaws\.com/.+",               # global endpoint
    r"https?://s3\.amazonaws\.com/[^/]+/.+",
    r"https?://[^/]+\.s3-[^.]+\.amazonaws\.com/.+",         # legacy regional endpoint
    r"https?://s3-[^.]+\.amazonaws\.com/[^/]+/.+",
)]
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_WEBHDFS = re.compile(r"https?://[^/]+:\d+/webhdfs/v1/.+", re.IGNORECASE)


def _scheme(url: str) -> str:
    """`url`'s scheme in lower case; a RuntimeError ("Bad scheme") where it has none."""
    m = _SCHEME.match(url)
    if m is None:
        raise RuntimeError(f"ferry.kvikio.RemoteFile: Bad scheme: {_shown(url)!r} has no "
                           "scheme (s3://, http:// or https://)")
    return m.group(1).lower()


def _aws_s3_http(url: str) -> bool:
    return any(p.fullmatch(url) for p in _AWS_S3_HTTP)


def _fits_presigned(url: str) -> bool:
    query = urllib.parse.urlsplit(url).query
    return _aws_s3_http(url) and "X-Amz-Algorithm" in query and "X-Amz-Signature" in query


def _fits_s3(url: str) -> bool:
    scheme = _scheme(url)
    if scheme == "s3":
        parts = urllib.parse.urlsplit(url)
        return bool(parts.netloc) and len(parts.path) > 1
    return scheme in ("http", "https") and _aws_s3_http(url) and not _fits_presigned(url)


def _fits_http(url: str) -> bool:
    return _scheme(url) in ("http", "https") and len(urllib.parse.urlsplit(url).path) > 1


_FITS = {
    RemoteEndpointType.S3: _fits_s3, RemoteEndpointType.S3_PUBLIC: _fits_s3,
    RemoteEndpointType.S3_PRESIGNED_URL: _fits_presigned,
    RemoteEndpointType.WEBHDFS: lambda url: _WEBHDFS.fullmatch(url) is not None,
    RemoteEndpointType.HTTP: _fits_http,
}


def _infer(url: str, allow_list: Sequence[RemoteEndpointType]) -> RemoteEndpointType:
    _scheme(url)
    for kind in allow_list:
        kind = RemoteEndpointType(kind)
        if kind in _FITS and _FITS[kind](url):
            return kind
    raise RuntimeError(f"ferry.kvikio.RemoteFile: Unsupported endpoint URL: {_shown(url)}")


def infer_remote_endpoint_type(url: str) -> RemoteEndpointType:
    """The kind ``RemoteFile.open(url)`` takes `url` for (KvikIO's default allow list, in its
    order); a RuntimeError where it has no scheme ("Bad scheme") or fits none ("Unsupported
    endpoint URL"). Opens nothing."""
    return _infer(url, _DEFAULT_ALLOW_LIST)


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
        self._nbytes = _known_size(self._file, nbytes, url)
        return self

    @classmethod
    def open(cls, url: str, remote_endpoint_type: RemoteEndpointType = RemoteEndpointType.AUTO,
             allow_list: Optional[Sequence[RemoteEndpointType]] = None,
             nbytes: Optional[int] = None) -> "RemoteFile":
        """Opens `url` as KvikIO's ``RemoteFile.open`` does. ``AUTO`` tries the kinds of
        `allow_list` in its order (default: S3, S3_PUBLIC, S3_PRESIGNED_URL, WEBHDFS, HTTP) and
        takes the first the URL fits: S3 for ``s3://bucket/key`` and AWS-style
        ``https://...amazonaws.com/...`` URLs, S3_PRESIGNED_URL for those with
        ``X-Amz-Algorithm`` and ``X-Amz-Signature`` in the query, WEBHDFS for
        ``http(s)://host:port/webhdfs/v1/...`` (not in ferry: NotImplementedError), HTTP for
        any other http(s) URL with a path. An explicit kind must be in `allow_list` and fit the
        URL. A URL without a scheme, one that fits no allowed kind, or a kind not in
        `allow_list` is a RuntimeError, as KvikIO's. ferry then reads the URL as it reads any
        (s3:// signed with AWS_* credentials where set, http(s):// as given)."""
        allowed = list(_DEFAULT_ALLOW_LIST if allow_list is None else allow_list)
        kind = RemoteEndpointType(remote_endpoint_type)
        _scheme(url)
        if kind == RemoteEndpointType.AUTO:
            kind = _infer(url, allowed)
        else:
            if kind not in allowed:
                raise RuntimeError(f"ferry.kvikio.RemoteFile.open: {_KIND_NAMES[kind]} is not in "
                                   "the allowlist.")
            if not _FITS[kind](url):
                raise RuntimeError(f"ferry.kvikio.RemoteFile.open: Invalid URL for "
                                   f"{_KIND_NAMES[kind]} endpoint: {_shown(url)}")
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
        """An s3:// URL (signed); an http:// or https:// URL is read as given (anonymous or
        presigned). Another scheme is a ValueError ("Unsupported protocol"), as KvikIO's."""
        if urllib.parse.urlsplit(url.lower()).scheme not in ("s3", "http", "https"):
            raise ValueError(f"ferry.kvikio.RemoteFile.open_s3_url: Unsupported protocol: "
                             f"{_shown(url)}")
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

    def __str__(self) -> str:
        """``<RemoteFile "URL">``, as KvikIO's; the URL without its query (a presigned URL's
        signature lives there) and without ``user:password@``."""
        return f'<{type(self).__name__} "{_shown(self._file.path)}">'

    def __repr__(self) -> str:
        return self.__str__()

    def remote_endpoint_type(self) -> RemoteEndpointType:
        return self._kind

    def nbytes(self) -> int:
        """The object's size, learned when it was opened (or `nbytes` as given to open)."""
        return self._nbytes

    def pread(self, buf: Any, size: Optional[int] = None, file_offset: int = 0) -> IOFuture:
        """Starts reading `size` bytes (default: all of `buf`) at `file_offset` into `buf` (host
        or GPU memory): ranged GETs on ferry's workers. A read past ``nbytes()`` is a
        ValueError before any request, as KvikIO's ("cannot read OFFSET+SIZE bytes into a
        NBYTES bytes file")."""
        try:
            n = _ferry.buffer_info(buf, True)[1] if size is None else operator.index(size)
            offset = operator.index(file_offset)
            if offset >= 0 and n >= 0 and offset + n > self._nbytes:
                raise ValueError(f"ferry.kvikio.RemoteFile: cannot read {offset}+{n} bytes into "
                                 f"a {self._nbytes} bytes file ({_shown(self._file.path)})")
            return _RemoteIOFuture(_ferry.File.pread(self._file, buf, size, file_offset))
        except ferry_errors.Error as e:
            raise kvikio_error(e) from None

    def read(self, buf: Any, size: Optional[int] = None, file_offset: int = 0) -> int:
        """``pread(...).get()``."""
        return self.pread(buf, size, file_offset).get()


def is_remote_file_available() -> bool:
    """Whether libcurl could be loaded (remote sources need it)."""
    return bool(_ferry.remote_support()[0])
