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

import operator
from typing import Any, Dict, List, Optional

from ..checkpoint import _PACKED, Checkpoint, CheckpointError, _framework, load_checkpoint

SafetensorError = CheckpointError


class _Slice:
    """A tensor of a safe_open file, read only where indexed: a slice of dimension 0 reads just
    those rows; the rest of the index is applied to them (and copied to be contiguous)."""

    def __init__(self, handle: "safe_open", name: str) -> None:
        self._h = handle
        self._entry = handle._ckpt.entry(name)

    def get_shape(self) -> List[int]:
        return list(self._entry.shape)

    def get_dtype(self) -> str:
        return self._entry.dtype

    def __getitem__(self, index: Any) -> Any:
        e, fw = self._entry, self._h._fw
        if e.dtype in _PACKED:
            raise TypeError(f"ferry: tensor '{e.name}' is {e.dtype} (packed): slice its bytes "
                            f"after get_tensor instead")
        if not isinstance(index, tuple):
            index = (index,)
        if not e.shape:
            return self._h.get_tensor(e.name)[index]
        rows = e.shape[0]
        first = index[0] if index else slice(None)
        if isinstance(first, slice) and (first.step is None or first.step > 0):
            start, stop, step = first.indices(rows)
            lo, hi = start, max(start, stop)
            local: Any = slice(0, hi - lo, step)
        elif isinstance(first, slice):  # a negative step: read them all, let the framework index
            lo, hi, local = 0, rows, first
        else:
            try:
                i = operator.index(first)
            except TypeError:  # Ellipsis, None, arrays: read everything
                lo, hi, local = 0, rows, first
            else:
                if not -rows <= i < rows:
                    raise IndexError(f"ferry: index {i} is out of range for dimension 0 of "
                                     f"tensor '{e.name}' (size {rows})")
                i %= rows
                lo, hi, local = i, i + 1, 0
        part = self._h._ckpt.read_rows(fw, e, lo, hi)
        result = part[(local,) + tuple(index[1:])]
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
