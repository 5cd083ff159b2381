"""``ferry.safetensors.torch.load_file``: safetensors.torch's load_file on ferry's loader."""

from __future__ import annotations

import os
from typing import Any, Dict, Union

from ..checkpoint import load_checkpoint


def load_file(filename: Union[str, "os.PathLike[str]"], device: Any = "cpu", *,
              dtype: Any = None, one_allocation: bool = False) -> Dict[str, Any]:
    """Every tensor of `filename` (a .safetensors file, an index or a directory of shards) as
    torch tensors on `device` ("cpu", "cuda", "cuda:N" or an ordinal). `dtype` converts the
    floating-point tensors on the device they land on; `one_allocation` backs them all with one
    allocation (faster to allocate, freed only all together)."""
    return load_checkpoint(filename, device=device, framework="pt", dtype=dtype,
                           one_allocation=one_allocation)


__all__ = ["load_file"]
