"""Shared fixtures. Run with the package on the path:
    PYTHONPATH=<repo>/python python3 -m pytest -q tests/python
or against an installed package, from a copy of these tests outside the source tree, with
FERRY_EXPECT_INSTALLED=1 to make sure it is that package they import (scripts/test does).
`gpu` tests skip, with the reason, when CuPy/PyTorch or a GPU is missing."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

import ferry

if os.environ.get("FERRY_EXPECT_INSTALLED"):
    assert os.path.realpath(ferry.__file__).startswith(os.path.realpath(sys.prefix) + os.sep), (
        f"FERRY_EXPECT_INSTALLED: ferry was imported from {ferry.__file__}, not from the "
        f"environment at {sys.prefix}")


@pytest.fixture(scope="session")
def data_file(tmp_path_factory):
    """(path, bytes): 8 MiB + 12345 bytes of random data."""
    path = tmp_path_factory.mktemp("data") / "random.bin"
    data = os.urandom((8 << 20) + 12345)
    path.write_bytes(data)
    return str(path), data


@pytest.fixture
def registered_dtype():
    """A dtype registered from outside NumPy's own types as ml_dtypes registers bfloat16
    (PyArray_RegisterDataType: dtype.isbuiltin 2, kind 'V', no buffer-protocol format):
    ml_dtypes' bfloat16 where installed (the GPU machine), else NumPy's own test dtype
    `rational`, registered the same way."""
    import numpy as np

    try:
        import ml_dtypes  # type: ignore[import]
        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        pass
    for module in ("numpy._core._rational_tests", "numpy.core._rational_tests"):
        try:
            return np.dtype(importlib.import_module(module).rational)
        except ImportError:
            continue
    pytest.skip("neither ml_dtypes nor NumPy's _rational_tests is importable")


@pytest.fixture
def numpy_with_bfloat16(monkeypatch, registered_dtype):
    """NumPy as in a process that imported ml_dtypes (JAX, TensorFlow, ONNX do; the GPU machine
    has it): numpy.dtype("bfloat16") resolves, to a dtype registered from outside NumPy,
    through numpy.sctypeDict, where ml_dtypes puts its names."""
    import numpy as np

    monkeypatch.setitem(np.sctypeDict, "bfloat16", registered_dtype.type)
    assert np.dtype("bfloat16") == registered_dtype and registered_dtype.isbuiltin == 2
    return registered_dtype


@pytest.fixture(autouse=True)
def default_settings():
    """Each test starts and ends with the same process-wide settings."""
    before = ferry.settings.as_dict()
    yield
    ferry.settings.update(**before)


def _gpu_module(name: str):
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        pytest.skip(f"{name} is not installed ({e})")
    try:
        count = (module.cuda.runtime.getDeviceCount() if name == "cupy"
                 else module.cuda.device_count())
    except Exception as e:  # CuPy raises its own CUDA errors without a driver
        pytest.skip(f"{name} sees no GPU ({e})")
    if count == 0:
        pytest.skip(f"{name} sees no GPU")
    return module


@pytest.fixture
def cupy():
    return _gpu_module("cupy")


@pytest.fixture
def torch():
    return _gpu_module("torch")
