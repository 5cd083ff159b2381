"""``moto.server.ThreadedMotoServer(ip_address, port)`` for KvikIO's test_s3_io.py: ``start()``
runs s3rver (tests/python/remote_servers.py finds it: scripts/install-s3rver, or FERRY_S3RVER)
on that address and port through s3rver_as_moto.js, which adds the two habits of moto that the
tests rely on (any credentials; CreateBucket of any name, again and again), and returns once it
answers. test_s3_io.py starts it in a child process that it kills when the session ends: s3rver
gets SIGTERM then (PR_SET_PDEATHSIG) and removes its data directory."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3] / "python"))  # tests/python: remote_servers
import remote_servers  # noqa: E402

STARTUP_TIMEOUT_S = 20.0


def _die_with_parent() -> None:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ThreadedMotoServer:
    def __init__(self, ip_address: str = "127.0.0.1", port: int = 5000, verbose: bool = False):
        self._ip = ip_address
        self._port = port
        self._proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        argv = remote_servers.find_s3rver()  # [node, (--openssl-legacy-provider), s3rver.js]
        package = Path(argv[-1]).resolve().parents[1]
        data = tempfile.mkdtemp(prefix="ferry-s3rver-as-moto-")
        self._proc = subprocess.Popen(
            argv[:-1] + [str(HERE / "s3rver_as_moto.js"), str(package), self._ip,
                         str(self._port), data],
            stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"s3rver (as moto) exited with status {self._proc.returncode} "
                                   f"before it listened on {self._ip}:{self._port}")
            try:
                socket.create_connection((self._ip, self._port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"s3rver (as moto) did not listen on {self._ip}:"
                                       f"{self._port} within {STARTUP_TIMEOUT_S:.0f} s")
                time.sleep(0.05)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(5)
        self._proc = None
