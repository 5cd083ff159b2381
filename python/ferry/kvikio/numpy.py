"""``kvikio.numpy``: ``fromfile`` and ``tofile`` through ferry, and ``LikeWrapper`` so that
``numpy.fromfile(path, dtype, like=LikeWrapper(cupy.empty(())))`` reads straight into GPU
memory."""

from __future__ import annotations

import io
import operator
import os
from typing import Any, Protocol, Union, runtime_checkable

import numpy as np

__all__ = ["FileLike", "LikeWrapper", "fromfile", "tofile"]


@runtime_checkable
class FileLike(Protocol):
    """A file object for an OS-level file: it has ``fileno()`` and ``name``."""

    def fileno(self) -> int: ...

    @property
    def name(self) -> str: ...


class LikeWrapper:
    """Wraps an array for NumPy's ``like=`` argument: ``numpy.fromfile(..., like=
    LikeWrapper(cupy.empty(())))`` is ``ferry.kvikio.numpy.fromfile(..., like=<that array>)``;
    other NumPy functions called with it run as they are."""

    def __init__(self, like: Any) -> None:
        self._like = like

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if func is not np.fromfile:
            return func(*args, **kwargs)
        return fromfile(*args, like=self._like, **kwargs)


def _path_and_position(file: Any) -> tuple[str, int]:
    if isinstance(file, FileLike):
        position = 0
        tell = getattr(file, "tell", None)
        if callable(tell):
            try:
                position = int(tell())
            except (OSError, ValueError):
                position = 0
        return str(file.name), position
    return os.fspath(file), 0


def fromfile(file: Union[str, "os.PathLike[str]", io.IOBase], dtype: Any = float,
             count: int = -1, sep: str = "", offset: int = 0, *, like: Any = None) -> Any:
    """``numpy.fromfile`` through ferry: `count` items of `dtype` (-1: all) from `offset` bytes
    into the file (for a file object, from its current position, as NumPy does), into an
    array like `like` (a CuPy array: GPU memory; None: NumPy). Only binary files (``sep=""``);
    NumPy's silent truncation at the end of the file is kept."""
    from .cufile import CuFile

    if sep != "":
        raise NotImplementedError("Non-default value of the `sep` argument is not supported "
                                  "(ferry.kvikio.numpy.fromfile reads binary files)")
    count, offset = operator.index(count), operator.index(offset)
    if count < -1:
        raise ValueError(f"negative dimensions are not allowed (count={count})")
    if offset < 0:
        raise ValueError(f"offset must be >= 0, not {offset}")
    path, position = _path_and_position(file)
    start = position + offset
    nbytes = os.path.getsize(path)  # FileNotFoundError names the path
    itemsize = np.dtype(dtype).itemsize
    available = max(nbytes - start, 0) // itemsize
    count = available if count == -1 else min(count, available)
    out: Any
    if like is None:
        out = np.empty((count,), dtype=dtype)
    else:
        out = np.empty_like(like, shape=(count,), dtype=dtype)
    if count:
        with CuFile(path, "r") as f:
            f.read(out, file_offset=start)
    return out


def tofile(ary: Any, file: Union[str, "os.PathLike[str]", io.IOBase]) -> None:
    """Writes the array's bytes to `file` (a path or a file object's name), in C order whatever
    the array's layout; ``fromfile`` reads them back."""
    from .cufile import CuFile

    path, _ = _path_and_position(file)
    with CuFile(path, "w") as f:
        f.write(np.ascontiguousarray(ary, like=ary))
