"""Runs KvikIO's own tests (tests/, vendored unmodified; README.md) against ferry.kvikio, as a
KvikIO user would: ``python -m pytest -p ferry.kvikio.as_kvikio tests/third_party/kvikio/tests``
(tests/python/test_kvikio_upstream.py runs each file so). Only what the machine lacks is made up
here, never anything of kvikio:

- moto (test_s3_io.py's S3 server) is not in Debian: where it is not importable, stand_ins/moto
  puts s3rver where its ThreadedMotoServer is expected (stand_ins/moto/server.py says how).
- KvikIO's tests/utils.py imports CuPy at the top for helpers that only the CuPy cases use, and
  test_s3_io.py imports it for two others (localhost, find_free_port). Where CuPy is missing,
  utils.py is imported here once with a stand-in ``cupy`` module that holds only the two names
  its definitions evaluate (``float64``, ``ndarray``), and the stand-in is taken away at once:
  the CuPy cases (conftest's ``xp`` fixture: ``pytest.importorskip("cupy")``) still skip.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

if "kvikio" not in sys.modules:
    raise pytest.UsageError("run KvikIO's tests with -p ferry.kvikio.as_kvikio (README.md)")

if importlib.util.find_spec("moto") is None:
    sys.path.insert(0, str(HERE / "stand_ins"))


class _NoCuPy:
    """What the stand-in's names are: any use of one is an error."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("CuPy is not installed: this stand-in only lets utils.py import")


if importlib.util.find_spec("cupy") is None:
    sys.path.insert(0, str(HERE / "tests"))
    stand_in = types.ModuleType("cupy", "a stand-in: utils.py imports, nothing else works")
    stand_in.float64 = _NoCuPy  # type: ignore[attr-defined]
    stand_in.ndarray = _NoCuPy  # type: ignore[attr-defined]
    sys.modules["cupy"] = stand_in
    try:
        import utils  # noqa: F401  (KvikIO's tests/utils.py, kept in sys.modules)
    finally:
        del sys.modules["cupy"]
