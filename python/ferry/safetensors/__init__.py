"""safetensors' API on ferry's loader, so switching is a one-line change:

    from ferry.safetensors.torch import load_file     # was: from safetensors.torch import ...
    tensors = load_file("model.safetensors", device="cuda:0")

    from ferry.safetensors import safe_open
    with safe_open("model.safetensors", framework="pt", device="cuda:0") as f:
        w = f.get_tensor("lm_head.weight")
        rows = f.get_slice("embed.weight")[0:1024]

Headers are validated strictly before any tensor byte is read (a bad file raises
ferry.CheckpointError, also reachable as SafetensorError, a ValueError). Each tensor has its own
allocation unless ``one_allocation=True`` is asked for. See docs/checkpoints.md.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .._weights import read_index
from ..checkpoint import Checkpoint, CheckpointError, _framework, load_checkpoint

SafetensorError = CheckpointError


class _Slice:
    """A tensor of a safe_open file, read only where indexed: ranges, ints and lists of ints on
    any dimension (and Ellipsis, None) read only the bytes of the box they touch (one gathered
    request); any other index reads the whole tensor and applies it."""

    def __init__(self, handle: "safe_open", name: str) -> None:
        self._h = handle
        self._entry = handle._ckpt.entry(name)

    def get_shape(self) -> List[int]:
        return list(self._entry.shape)

    def get_dtype(self) -> str:
        return self._entry.dtype

    def __getitem__(self, index: Any) -> Any:
        fw = self._h._fw
        result, _ = read_index(self._h._ckpt, fw, self._entry, index)
        if fw.name == "pt":
            return result.contiguous()
        if fw.name == "jax":
            return result
        return fw.np.ascontiguousarray(result)


class safe_open:
    """``safe_open(filename, framework="pt"|"numpy"|"cupy"|"jax", device="cpu")``, as in
    safetensors: keys(), metadata(), get_tensor(name), get_slice(name)[...]. `filename` may also
    be an index or a directory of shards."""

    def __init__(self, filename: Any, framework: str, device: Any = "cpu") -> None:
        self._ckpt = Checkpoint(filename)
        self._fw = _framework(framework, device)
        self._device = device

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def keys(self) -> List[str]:
        return sorted(self._ckpt.entries)

    def offset_keys(self) -> List[str]:
        """Names in the order of their bytes in the file (shard by shard)."""
        return list(self._ckpt.entries)

    def metadata(self) -> Optional[Dict[str, str]]:
        meta = self._ckpt.metadata(0)
        return meta or None

    def get_tensor(self, name: str) -> Any:
        return self._ckpt.load(self._fw.name, self._device, names=[name])[name]

    def get_slice(self, name: str) -> _Slice:
        return _Slice(self, name)


__all__ = ["SafetensorError", "load_checkpoint", "safe_open"]
