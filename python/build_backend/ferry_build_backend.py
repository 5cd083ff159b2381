"""ferry's PEP 517 build backend: scikit-build-core where it can be imported, otherwise setuptools
with setup.py, which drives the same CMake build (Debian 12 ships setuptools but no
scikit-build-core, and an offline `pip install --no-build-isolation .` must work there).
FERRY_BUILD_BACKEND=setuptools or =scikit-build-core forces one. This module only forwards
pip's calls; it builds nothing itself."""

from __future__ import annotations

import os
import sys

_choice = os.environ.get("FERRY_BUILD_BACKEND", "")
if _choice not in ("", "setuptools", "scikit-build-core"):
    raise RuntimeError(f"FERRY_BUILD_BACKEND={_choice!r}: expected setuptools or scikit-build-core")

_backend = None
if _choice != "setuptools":
    try:
        from scikit_build_core import build as _backend  # type: ignore[no-redef]
    except ImportError:
        if _choice:
            raise
if _backend is None:
    from setuptools import build_meta as _backend  # type: ignore[no-redef]

print(f"ferry: building with {_backend.__name__}", file=sys.stderr)

_HOOKS = (
    "build_wheel", "get_requires_for_build_wheel", "prepare_metadata_for_build_wheel",
    "build_editable", "get_requires_for_build_editable", "prepare_metadata_for_build_editable",
    "build_sdist", "get_requires_for_build_sdist",
)
for _name in _HOOKS:
    if hasattr(_backend, _name):
        globals()[_name] = getattr(_backend, _name)

if _backend.__name__.startswith("setuptools"):
    def build_sdist(sdist_directory, config_settings=None):  # type: ignore[no-redef]
        """setup.py packages wheels only: an sdist of it would lack the C++ sources."""
        raise RuntimeError("ferry's sdist is made by scikit-build-core (install it, or use "
                           "`git archive`); the setuptools fallback builds wheels only")
