"""``ferry.safetensors.numpy``: safetensors.numpy's load_file, save_file, load and save on ferry. NumPy
has no bfloat16 or float8: BF16 tensors come back as uint16 and the F8 kinds as uint8 with the
same bits (``.view(ml_dtypes.bfloat16)`` gives the values); F4 and F6 kinds as flat uint8 bytes."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Union

from .. import _save
from ..checkpoint import load_bytes, load_checkpoint


def load_file(filename: Union[str, "os.PathLike[str]"], *,
              one_allocation: bool = False, progress: Any = None) -> Dict[str, Any]:
    """Every tensor of `filename` (a .safetensors file, an index or a directory of shards) as
    NumPy arrays in host memory. `progress`: as ferry.safetensors.torch.load_file's."""
    return load_checkpoint(filename, device="cpu", framework="numpy",
                           one_allocation=one_allocation, progress=progress)


def save_file(tensor_dict: Dict[str, Any], filename: Union[str, "os.PathLike[str]"],
              metadata: Optional[Dict[str, str]] = None, *, durable: bool = True,
              asynchronous: bool = False, snapshot: bool = False, progress: Any = None) -> Any:
    """Saves NumPy arrays (C-contiguous; big-endian ones are byte-swapped into a copy) to
    `filename` as safetensors.numpy.save_file does, durably and atomically; the options are
    those of ferry.safetensors.torch.save_file."""
    return _save.save_file(tensor_dict, filename, metadata, "numpy", durable=durable,
                           asynchronous=asynchronous, snapshot_first=snapshot,
                           progress=progress)


def save(tensor_dict: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes safetensors.numpy.save returns."""
    return _save.to_bytes(tensor_dict, "numpy", metadata)


def load(data: bytes) -> Dict[str, Any]:
    """The arrays of a safetensors file held in `data` (what safetensors.numpy.load takes), each
    owning its memory."""
    return load_bytes(data, "numpy")


__all__ = ["load", "load_file", "save", "save_file"]
