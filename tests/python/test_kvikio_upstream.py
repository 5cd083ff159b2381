"""KvikIO's own remote tests (tests/third_party/kvikio: test_http_io.py, test_s3_io.py,
test_remote_endpoint_utils.py, vendored unmodified) against ferry.kvikio, each file in a pytest
of its own, run as a KvikIO user runs them: ``python -m pytest -p ferry.kvikio.as_kvikio FILE``.
A file passes when its pytest does: no failure, no error. Their HTTP server is KvikIO's
LocalHttpServer (ferry.kvikio.utils); their S3 server is s3rver in moto's place (the
directory's conftest.py). Skipped, saying why, only where such a server cannot run here."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ferry.kvikio

sys.path.insert(0, str(Path(__file__).resolve().parent))
import remote_servers  # noqa: E402

SUITE = Path(__file__).resolve().parents[1] / "third_party" / "kvikio"
# pytest's last line: "38 passed, 56 skipped, 48 warnings in 5.74s" (between "=" with -rs).
SUMMARY = re.compile(r"^=* ?(\d+ (?:passed|failed|skipped|errors?|deselected)\b.*?) in [\d.]+s",
                     re.MULTILINE)


def run_suite(name: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # ferry's package as this interpreter imports it (the tree's python/, or the installed one).
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(ferry.__file__).resolve().parents[1])] +
        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ferry.kvikio.as_kvikio", "-q", "-rs",
         f"tests/{name}"], cwd=SUITE, env=env, capture_output=True, text=True, timeout=900)


def check(name: str) -> None:
    if not ferry.kvikio.is_remote_file_available():
        pytest.skip("ferry cannot load libcurl: KvikIO's remote tests would all skip")
    r = run_suite(name)
    summary = SUMMARY.findall(r.stdout)
    print(f"KvikIO's {name}: {summary[-1] if summary else '(no summary)'}")
    assert r.returncode == 0, (f"KvikIO's {name} against ferry.kvikio: exit {r.returncode}\n"
                               f"{r.stdout[-20000:]}\n{r.stderr[-5000:]}")
    assert summary and "passed" in summary[-1], r.stdout[-5000:]


def test_kvikio_http_io() -> None:
    check("test_http_io.py")


def test_kvikio_s3_io() -> None:
    if importlib.util.find_spec("boto3") is None:
        pytest.skip("boto3 is not installed (KvikIO's test_s3_io.py fills its buckets with it): "
                    "apt-get install python3-boto3")
    try:
        remote_servers.find_s3rver()
    except remote_servers.ServerUnavailable as e:
        pytest.skip(str(e))
    check("test_s3_io.py")


def test_kvikio_remote_endpoint_utils() -> None:
    check("test_remote_endpoint_utils.py")
