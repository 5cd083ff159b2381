"""``ferry.safetensors.numpy.load_file``: safetensors.numpy's load_file on ferry's loader. NumPy
has no bfloat16 or float8: BF16 tensors come back as uint16 and the F8 kinds as uint8 with the
same bits (``.view(ml_dtypes.bfloat16)`` gives the values); F4 and F6 kinds as flat uint8 bytes."""

from __future__ import annotations

import os
from typing import Any, Dict, Union

from ..checkpoint import load_checkpoint


def load_file(filename: Union[str, "os.PathLike[str]"], *,
              one_allocation: bool = False) -> Dict[str, Any]:
    """Every tensor of `filename` (a .safetensors file, an index or a directory of shards) as
    NumPy arrays in host memory."""
    return load_checkpoint(filename, device="cpu", framework="numpy",
                           one_allocation=one_allocation)


__all__ = ["load_file"]
