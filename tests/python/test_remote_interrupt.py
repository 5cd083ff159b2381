"""Ctrl-C during a remote open or read (issue 45, B4): a real SIGINT to a child process must raise
KeyboardInterrupt within a second while the server keeps the child waiting (a HEAD or GET that
is never answered, a Retry-After of 20 s), and the GET in flight must be dropped then, not when
the child exits."""

from __future__ import annotations

import http.server
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import ferry

pytestmark = pytest.mark.skipif(not ferry.remote_support()[0],
                                reason=f"no libcurl: {ferry.remote_support()[1]}")

SIZE = 1 << 20

CHILD = r"""
import json, sys, time
import numpy as np
import ferry

url, how = sys.argv[1], sys.argv[2]
try:
    if how == "read":
        f = ferry.open(url)
        buf = np.empty(f.size, np.uint8)
        print("started", flush=True)
        f.read(buf)
    else:
        print("started", flush=True)
        ferry.open(url)
    print(json.dumps({"interrupted": False}), flush=True)
except KeyboardInterrupt:
    at = time.monotonic()
    print(json.dumps({"interrupted": True, "at": at}), flush=True)
    time.sleep(2)  # the connection must be dropped by the cancel, not by the exit
"""


class Server:
    """HEAD /x answers its size; GET /x is never answered; every request of /busy is 503 with a
    Retry-After of 20 s. Notes when a connection kept waiting is closed by the client."""

    def __init__(self) -> None:
        self.dropped_at: list[float] = []
        self.stop = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):  # noqa: A002 (the base class's name)
                pass

            def do_HEAD(self):
                if self.path.startswith("/busy"):
                    return self._busy()
                if self.path.startswith("/silent"):
                    return self._never_answer()
                self.send_response(200)
                self.send_header("Content-Length", str(SIZE))
                self.send_header("ETag", '"x"')
                self.end_headers()

            def do_GET(self):
                if self.path.startswith("/busy"):
                    return self._busy()
                self._never_answer()

            def _busy(self):
                self.send_response(503)
                self.send_header("Retry-After", "20")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _never_answer(self):
                sock = self.connection
                while not server.stop.is_set():
                    ready, _, _ = select.select([sock], [], [], 0.02)
                    if ready and sock.recv(1, socket.MSG_PEEK) == b"":
                        server.dropped_at.append(time.monotonic())
                        return
                self.close_connection = True

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.mark.parametrize("how, path", [("read", "/x"), ("open", "/silent"), ("open", "/busy")])
def test_sigint_during_a_remote_request_raises_within_a_second(server, how, path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "FERRY_REMOTE_TIMEOUT": "600", "FERRY_REMOTE_RETRIES": "8"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, server.url + path, how],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert child.stdout.readline() == "started\n", child.stderr.read()
        time.sleep(0.5)  # the request is in flight (or in its retry wait) by now
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        ready, _, _ = select.select([child.stdout], [], [], 5)
        assert ready, "no KeyboardInterrupt within 5 s of SIGINT"
        line = child.stdout.readline()
        assert line, child.stderr.read()
        got = json.loads(line)
        if path != "/busy":
            deadline = time.monotonic() + 1.5
            while not server.dropped_at and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    assert got["interrupted"], "the request ended before the signal"
    delay = got["at"] - sent
    assert delay < 1.0, f"KeyboardInterrupt {delay:.3f} s after SIGINT"
    if path != "/busy":
        assert server.dropped_at, "the request in flight was not dropped"
        assert server.dropped_at[0] - sent < 1.0, "the request in flight was dropped late"
