"""The type stubs (python/ferry/_ferry.pyi) and the package's annotations pass mypy --strict on
a small program (Debian's python3-mypy; skipped without it)."""

import os
import site
import subprocess
import sys

import pytest

PROGRAM = """import concurrent.futures
import pathlib
from typing import Optional

import numpy as np

import ferry


def main(path: pathlib.Path) -> int:
    buf = np.empty(1 << 20, np.uint8)
    with ferry.open(path, task_size="1MiB") as f:
        n: int = f.read(buf, size=1000, file_offset=0)
        fut: ferry.Future = f.pread(bytearray(10))
        concurrent.futures.wait([fut])
        route: Optional[ferry.RouteReport] = f.last_route
        if route is not None:
            print(route.tasks, route.to_dict(), fut.last_route.bytes)
    arr = ferry.fromfile(path, np.uint8, device="cpu")
    with ferry.settings(task_size="2MiB"):
        size: int = ferry.settings["task_size"]
    try:
        ferry.load(path)
    except ferry.IoError as e:
        print(e.bytes_done, e.op)
    return n + int(arr.size) + size


if __name__ == "__main__":
    main(pathlib.Path("/etc/hostname"))
"""


def test_stubs_pass_mypy_strict_on_an_example(tmp_path):
    pytest.importorskip("mypy", reason="python3-mypy is not installed")
    program = tmp_path / "example.py"
    program.write_text(PROGRAM)
    package = os.path.dirname(os.path.dirname(__import__("ferry").__file__))
    env = dict(os.environ)
    if package not in site.getsitepackages():  # an installed ferry is found without (and mypy
        env["MYPYPATH"] = package                # refuses site-packages in MYPYPATH)
    # ferry's modules import torch inside functions; following those imports made mypy analyse
    # all of torch (52 of its 55 CPU-s here) for errors that --follow-imports=silent hides
    # anyway: the example uses no torch type, so torch is not followed (its names are Any).
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--strict",
         "--no-incremental", "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache"),
         str(program)],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
