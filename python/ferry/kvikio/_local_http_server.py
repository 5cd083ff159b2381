"""``kvikio.utils.LocalHttpServer``: a directory served over HTTP on 127.0.0.1 by a child
process, for tests of ``RemoteFile`` (KvikIO's own ``test_http_io.py`` uses it):

    with LocalHttpServer(root, range_support=True, max_lifetime=60) as server:
        RemoteFile.open_http(f"{server.url}/a.bin")

KvikIO's interface: ``LocalHttpServer(root_path, range_support=True, max_lifetime=120,
handler=None, handler_options=None)``; inside the block ``ip``, ``port`` and ``url``
(``http://IP:PORT``). `handler` is an ``http.server.BaseHTTPRequestHandler`` class made with
``handler(*args, directory=root_path, **handler_options)``; without one, ``range_support``
chooses a handler that answers ``Range: bytes=...`` with 206 (written here; KvikIO uses the
``rangehttpserver`` package) or ``http.server``'s, which ignores ranges and sends the whole file.
The child is forked (the handler class need not be importable, and state it keeps across
requests lives in the child), runs at most `max_lifetime` seconds, dies with its parent, and is
killed when the block exits. Slow (Python, one thread per connection): for tests only."""

from __future__ import annotations

import functools
import io
import multiprocessing
import os
import re
import signal
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional, Union

_STARTUP_TIMEOUT_S = 30.0
_ONE_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def _byte_range(spec: str, size: int) -> Optional[tuple[int, int]]:
    """The first and last byte that `spec` (a Range header) asks of a `size`-byte file; None
    where it is not one range of bytes (the header is then ignored, as RFC 9110 allows), (-1,
    -1) where that range lies outside the file (416)."""
    m = _ONE_RANGE.fullmatch(spec.strip())
    if m is None or (m.group(1) == "" and m.group(2) == ""):
        return None
    if m.group(1) == "":  # bytes=-N: the last N bytes
        n = int(m.group(2))
        return (-1, -1) if n == 0 or size == 0 else (max(0, size - n), size - 1)
    first = int(m.group(1))
    last = size - 1 if m.group(2) == "" else min(int(m.group(2)), size - 1)
    if first >= size or last < first:
        return (-1, -1)
    return first, last


class RangeRequestHandler(SimpleHTTPRequestHandler):
    """``http.server``'s file handler that also answers one ``Range: bytes=...`` per GET with
    206 Partial Content (416 outside the file) and says ``Accept-Ranges: bytes``."""

    def end_headers(self) -> None:
        self.send_header("Accept-Ranges", "bytes")
        super().end_headers()

    def send_head(self) -> Any:
        spec = self.headers.get("Range")
        path = self.translate_path(self.path)
        if spec is None or self.command != "GET" or not os.path.isfile(path):
            return super().send_head()
        try:
            f = open(path, "rb")
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        with f:
            size = os.fstat(f.fileno()).st_size
            span = _byte_range(spec, size)
            if span is None:
                return super().send_head()
            if span == (-1, -1):
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            first, last = span
            f.seek(first)
            body = f.read(last - first + 1)
        self.send_response(HTTPStatus.PARTIAL_CONTENT)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


def _die_with_parent() -> None:
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def _serve(conn: Any, handler: type, options: dict[str, Any], max_lifetime: float) -> None:
    """The child: binds a free port, sends (ip, port) or the error, serves until its lifetime
    ends."""
    _die_with_parent()
    try:
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, **options))
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    httpd.daemon_threads = True
    conn.send(("ready", httpd.server_address[:2]))
    conn.close()
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    time.sleep(max_lifetime)
    print(f"LocalHttpServer: stopping after its max_lifetime of {max_lifetime} s", flush=True)
    os._exit(0)


class LocalHttpServer:
    """Serves `root_path` on 127.0.0.1 in a child process while the ``with`` block runs."""

    def __init__(self, root_path: Union[str, "os.PathLike[str]"], range_support: bool = True,
                 max_lifetime: float = 120, handler: Optional[type[BaseHTTPRequestHandler]] = None,
                 handler_options: Optional[dict[str, Any]] = None) -> None:
        self.root_path = root_path
        self.range_support = range_support
        self.max_lifetime = max_lifetime
        self.handler = handler
        self.handler_options = dict(handler_options or {})
        self.process: Optional[multiprocessing.process.BaseProcess] = None

    def __enter__(self) -> "LocalHttpServer":
        if self.handler is not None:
            handler: type = self.handler
        else:
            handler = RangeRequestHandler if self.range_support else SimpleHTTPRequestHandler
        options = {**self.handler_options, "directory": os.fspath(Path(self.root_path))}
        context = multiprocessing.get_context("fork")
        parent, child = context.Pipe(duplex=False)
        self.process = context.Process(target=_serve, daemon=True,
                                       args=(child, handler, options, self.max_lifetime))
        self.process.start()
        child.close()
        try:
            if not parent.poll(_STARTUP_TIMEOUT_S):
                raise RuntimeError(f"LocalHttpServer: the server did not start within "
                                   f"{_STARTUP_TIMEOUT_S:.0f} s")
            state, value = parent.recv()
        except EOFError:
            self.process.join(1)
            raise RuntimeError(f"LocalHttpServer: the server process ended before it listened "
                               f"(exit code {self.process.exitcode})") from None
        except BaseException:
            self._stop()
            raise
        finally:
            parent.close()
        if state != "ready":
            self._stop()
            raise RuntimeError(f"LocalHttpServer: cannot serve {self.root_path}: {value}")
        self.ip, self.port = value
        self.url = f"http://{self.ip}:{self.port}"
        return self

    def _stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.process = None

    def __exit__(self, *exc: object) -> None:
        self._stop()
