"""``kvikio.remote_file``: KvikIO's ``RemoteFile`` on ferry's remote sources (HTTP, HTTPS and S3
through libcurl, docs/remote.md). WebHDFS is not supported. Reads take host or GPU memory; the
object is read-only."""

from __future__ import annotations

import concurrent.futures
import enum
import errno
import operator
import re
import threading
import time
import urllib.parse
from typing import Any, Callable, Optional, Sequence

from .. import _ferry
from .. import _errors as ferry_errors
from .._file import File
from .._future import _watcher
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


_NO_RANGES = "it ignored the Range header"  # the words of _no_ranges below
# ferry's errors name an HTTP answer "HTTP 503" (src/remote/remote_seam.cc, status_words).
_HTTP_STATUS = re.compile(r"\bHTTP (\d{3})\b")
# curl's words for CURLE_OPERATION_TIMEDOUT (a stall or a connect timeout).
_TIMED_OUT = re.compile(r"timed out|timeout|too slow", re.IGNORECASE)


def _words(e: BaseException) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror is not None else str(e)


def _http_status(e: BaseException) -> Optional[int]:
    m = _HTTP_STATUS.search(_words(e))
    return int(m.group(1)) if m else None


def _timed_out(e: BaseException) -> bool:
    return isinstance(e, OSError) and (e.errno == errno.ETIMEDOUT or (
        _http_status(e) is None and _TIMED_OUT.search(_words(e)) is not None))


class _Attempts:
    """KvikIO's retries (its libcurl shim), which ``ferry.kvikio`` runs itself so that a KvikIO
    user sees KvikIO's behaviour and words: a timeout, or an answer in ``http_status_codes``, is
    retried until ``http_max_attempts`` attempts were made, after 500 ms, 1 s, 2 s, 4 s, 4 s...,
    each announced on stdout (``KvikIO: Got HTTP code 503. Retrying after 500ms (attempt 1 of
    2).``); the last failure is ``KvikIO: HTTP request reached maximum number of attempts (2).
    Reason: Got HTTP code 503.``; an HTTP error not retried is libcurl's ``The requested URL
    returned error: 404``. ferry's own words follow in brackets. The objects RemoteFile opens
    make no retries of their own (``_open_without_retries``): KvikIO's attempts are all there
    are. The settings are read at each open and each read, as KvikIO reads them at each
    request."""

    def __init__(self) -> None:
        policy = _ferry.effective_remote_policy()
        self.max = int(policy["retries"]) + 1
        self.statuses = frozenset(int(c) for c in policy["retry_statuses"])

    def reason(self, e: BaseException) -> Optional[str]:
        """KvikIO's words for a failure it retries; None for one it does not."""
        if _timed_out(e):
            return "Timeout error"
        status = _http_status(e)
        if status is not None and status in self.statuses:
            return f"Got HTTP code {status}"
        return None

    def announce(self, reason: str, attempt: int) -> float:
        """Prints KvikIO's line for retrying after failed attempt `attempt` (1-based); returns
        the seconds to wait."""
        delay_ms = min(4000, 500 * (1 << min(attempt - 1, 4)))
        print(f"KvikIO: {reason}. Retrying after {delay_ms}ms (attempt {attempt} of {self.max}).",
              flush=True)
        return delay_ms / 1000

    def error(self, e: BaseException, retried: bool) -> BaseException:
        """`e` (ferry's) as ``ferry.kvikio`` raises it, in KvikIO's words where KvikIO has its
        own: attempts exhausted (`retried`: `e` was a failure it retries), an HTTP error."""
        e = kvikio_error(e)
        if not isinstance(e, OSError):
            return e
        status = _http_status(e)
        if retried:
            why = "Operation timed out." if _timed_out(e) else f"Got HTTP code {status}."
            return kvikio_error(e, f"KvikIO: HTTP request reached maximum number of attempts "
                                   f"({self.max}). Reason: {why} [{_words(e)}]")
        if status is not None and status >= 400:
            return kvikio_error(e, f"curl_easy_perform() error (The requested URL returned "
                                   f"error: {status}) [{_words(e)}]")
        return e


_policy_lock = threading.Lock()


def _open_without_retries(url: str) -> File:
    """`url` opened as a ferry File whose requests make one attempt each (``_Attempts`` makes
    KvikIO's). ferry reads its remote policy when an object opens, so the policy has no retries
    while this one opens, and is put back at once: another thread that opens a remote object
    through ferry's own API at that instant gets no retries either (docs/kvikio.md)."""
    with _policy_lock:
        before = _ferry.remote_policy()
        _ferry.set_remote_policy(0, before["stall_seconds"], before["retry_statuses"],
                                 before["request_seconds"])
        try:
            return File(url, "r")
        finally:
            _ferry.set_remote_policy(before["retries"], before["stall_seconds"],
                                     before["retry_statuses"], before["request_seconds"])


class _RemoteIOFuture(IOFuture):
    """``IOFuture`` of a remote read, retried as KvikIO retries (``_Attempts``: the whole read
    is submitted again after KvikIO's wait, on a timer thread). A read of less than the whole
    object from a server that ignores Range is ``OverflowError`` ("maybe the server doesn't
    support file ranges?"), as KvikIO's, though ferry's own API streams it (docs/remote.md):
    KvikIO's tests ask for the error; also the ferry class and ``RuntimeError``, as every
    ferry.kvikio error."""

    def __init__(self, submit: Callable[[], Any], attempts: _Attempts, size: int) -> None:
        self._submit = submit
        self._size = size  # the object's
        self._attempts = attempts
        self._attempt = 1
        self._retry_pending = False
        self._resubmitted = threading.Condition()
        super().__init__(submit())

    def _settle(self) -> None:
        with self._once:
            if self._settled:
                return
            self._settled = True
        request = self._request
        try:
            n = request.result()
        except BaseException as e:
            reason = self._attempts.reason(e)
            if reason is not None and self._attempt < self._attempts.max:
                delay = self._attempts.announce(reason, self._attempt)
                self._attempt += 1
                with self._resubmitted:
                    self._retry_pending = True
                timer = threading.Timer(delay, self._resubmit)
                timer.daemon = True
                timer.start()
                return
            self.set_exception(self._error(e, retried=reason is not None))
        else:
            refused = self._no_ranges(request)
            if refused is None:
                self.set_result(n)
            else:
                self.set_exception(refused)
        finally:
            request.release()

    def _no_ranges(self, request: Any) -> Optional[BaseException]:
        """KvikIO's OverflowError where the read was less than the whole object and the server
        ignores Range (ferry's route report says so)."""
        route = request.last_route
        if not route.source.range_ignored or (route.offset == 0 and route.requested >= self._size):
            return None
        e = ferry_errors.IoError(
            errno.EIO, f"GET {route.file} offset={route.offset} len={route.requested}: the server "
                       f"answered 200 (the whole object): {_NO_RANGES} (ferry.open reads such "
                       f"objects, streaming them; KvikIO's RemoteFile refuses them)")
        e.filename, e.op, e.offset, e.length = route.file, "GET", route.offset, route.requested
        return kvikio_error(e, f"maybe the server doesn't support file ranges? [{_words(e)}]",
                            also=(OverflowError,))

    def _resubmit(self) -> None:
        try:
            request = self._submit()
        except BaseException as e:
            self.set_exception(self._error(e, retried=True))
            request = None
        with self._resubmitted:
            if request is not None:
                self._request = request
                with self._once:
                    self._settled = False
            self._retry_pending = False
            self._resubmitted.notify_all()
        if request is not None:
            if request.done():
                self._settle()
            else:
                _watcher.watch(self)

    def _wait(self, timeout: Optional[float]) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._request.wait(left):
                raise TimeoutError(f"ferry: the read is still running after {timeout} s")
            self._settle()
            with self._resubmitted:
                while self._retry_pending:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError(f"ferry: the read is still retrying after {timeout} s")
                    self._resubmitted.wait(left)
            if concurrent.futures.Future.done(self):
                return

    def _error(self, e: BaseException, retried: bool = False) -> BaseException:
        e = self._attempts.error(e, retried)
        if (isinstance(e, OSError) and not isinstance(e, OverflowError)
                and _NO_RANGES in str(e)):
            return kvikio_error(e, f"maybe the server doesn't support file ranges? [{_words(e)}]",
                                also=(OverflowError,))
        return e


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
        attempts = _Attempts()
        for attempt in range(1, attempts.max + 1):
            try:
                self._file = _open_without_retries(url)
                break
            except ferry_errors.Error as e:
                reason = attempts.reason(e)
                if reason is None or attempt == attempts.max:
                    raise attempts.error(e, retried=reason is not None) from None
                time.sleep(attempts.announce(reason, attempt))
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
            return _RemoteIOFuture(
                lambda: _ferry.File.pread(self._file, buf, size, file_offset), _Attempts(),
                self._file.size)
        except ferry_errors.Error as e:
            raise kvikio_error(e) from None

    def read(self, buf: Any, size: Optional[int] = None, file_offset: int = 0) -> int:
        """``pread(...).get()``."""
        return self.pread(buf, size, file_offset).get()


def is_remote_file_available() -> bool:
    """Whether libcurl could be loaded (remote sources need it)."""
    return bool(_ferry.remote_support()[0])
