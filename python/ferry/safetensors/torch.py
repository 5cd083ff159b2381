"""``ferry.safetensors.torch``: safetensors.torch's load_file, save_file and save on ferry's
loader and writer. Files are byte-identical to safetensors 0.8's (docs/checkpoints.md)."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Union

from .. import _save
from ..checkpoint import load_checkpoint


def load_file(filename: Union[str, "os.PathLike[str]"], device: Any = "cpu", *,
              dtype: Any = None, one_allocation: bool = False) -> Dict[str, Any]:
    """Every tensor of `filename` (a .safetensors file, an index or a directory of shards) as
    torch tensors on `device` ("cpu", "cuda", "cuda:N" or an ordinal). `dtype` converts the
    floating-point tensors on the device they land on; `one_allocation` backs them all with one
    allocation (faster to allocate, freed only all together)."""
    return load_checkpoint(filename, device=device, framework="pt", dtype=dtype,
                           one_allocation=one_allocation)


def save_file(tensors: Dict[str, Any], filename: Union[str, "os.PathLike[str]"],
              metadata: Optional[Dict[str, str]] = None, *, durable: bool = True,
              asynchronous: bool = False, snapshot: bool = False) -> Any:
    """Saves `tensors` (CPU or CUDA, contiguous, not sharing memory) to `filename`, as
    safetensors.torch.save_file does, through ferry's write engine: one gathered write from GPU
    or host memory, durable (fsync of the file and its folder) and atomic (a temporary file
    renamed over `filename`) unless ``durable=False`` (still atomic). Returns None; with
    ``asynchronous=True`` a ``concurrent.futures.Future`` (its result: a ``SaveReport``) as soon
    as the tensors are captured: do not modify them until it is done, or pass ``snapshot=True``
    to have them copied first (on their device) so that they may change once this returns."""
    return _save.save_file(tensors, filename, metadata, "pt", durable=durable,
                           asynchronous=asynchronous, snapshot_first=snapshot)


def save(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes safetensors.torch.save returns: the same file, in memory."""
    return _save.to_bytes(tensors, "pt", metadata)


__all__ = ["load_file", "save", "save_file"]
