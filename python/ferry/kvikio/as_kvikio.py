"""Importing this module makes ``import kvikio`` (and ``kvikio.defaults``, ``kvikio.numpy``...)
give ``ferry.kvikio``, for programs and test suites that import kvikio in many places:

    import ferry.kvikio.as_kvikio     # first, before anything imports kvikio
    python -m pytest -p ferry.kvikio.as_kvikio <kvikio>/python/kvikio/tests

A kvikio already imported (the real one) is an ImportError: the two cannot share the name."""

from __future__ import annotations

import importlib
import sys

import ferry.kvikio

SUBMODULES = ("buffer", "cufile", "cufile_driver", "defaults", "mmap", "numpy", "nvcomp",
              "remote_file", "utils", "zarr")


def install() -> None:
    """Registers ferry.kvikio and its submodules under the name kvikio."""
    existing = sys.modules.get("kvikio")
    if existing is not None and existing is not ferry.kvikio:
        raise ImportError(f"ferry.kvikio.as_kvikio: a kvikio is already imported "
                          f"({getattr(existing, '__file__', existing)!r}); import "
                          "ferry.kvikio.as_kvikio before anything imports kvikio")
    sys.modules["kvikio"] = ferry.kvikio
    for name in SUBMODULES:
        sys.modules[f"kvikio.{name}"] = importlib.import_module(f"ferry.kvikio.{name}")


install()
