"""``ferry.safetensors.torch``: safetensors.torch's load_file, save_file, load, save, load_model
and save_model on ferry's loader and writer. Files are byte-identical to safetensors 0.8's
(docs/checkpoints.md)."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Set, Tuple, Union

from .. import _save
from ..checkpoint import load_bytes, load_checkpoint


def load_file(filename: Union[str, "os.PathLike[str]"], device: Any = "cpu", *,
              dtype: Any = None, one_allocation: bool = False,
              progress: Any = None) -> Dict[str, Any]:
    """Every tensor of `filename` (a .safetensors file, an index or a directory of shards) as
    torch tensors on `device` ("cpu", "cuda", "cuda:N" or an ordinal). `dtype` converts the
    floating-point tensors on the device they land on; `one_allocation` backs them all with one
    allocation (faster to allocate, freed only all together). `progress`: True for a bar on a
    terminal, or a callable progress(done_bytes, total_bytes) called from this thread while the
    reads run (docs/checkpoints.md, "Progress")."""
    return load_checkpoint(filename, device=device, framework="pt", dtype=dtype,
                           one_allocation=one_allocation, progress=progress)


def save_file(tensors: Dict[str, Any], filename: Union[str, "os.PathLike[str]"],
              metadata: Optional[Dict[str, str]] = None, *, durable: bool = True,
              asynchronous: bool = False, snapshot: bool = False, progress: Any = None) -> Any:
    """Saves `tensors` (CPU or CUDA, contiguous, not sharing memory) to `filename`, as
    safetensors.torch.save_file does, through ferry's write engine: one gathered write from GPU
    or host memory, durable (fsync of the file and its folder) and atomic (a temporary file
    renamed over `filename`) unless ``durable=False`` (still atomic). Returns None; with
    ``asynchronous=True`` a ``concurrent.futures.Future`` (its result: a ``SaveReport``) as soon
    as the tensors are captured: do not modify them until it is done, or pass ``snapshot=True``
    to have them copied first (on their device) so that they may change once this returns.
    ``progress``: True for a bar on a terminal, or a callable progress(done_bytes, total_bytes)
    called from the thread that writes (this one, or ferry's save thread when asynchronous); an
    exception it raises ends the save and leaves `filename` as it was."""
    return _save.save_file(tensors, filename, metadata, "pt", durable=durable,
                           asynchronous=asynchronous, snapshot_first=snapshot,
                           progress=progress)


def save(tensors: Dict[str, Any], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes safetensors.torch.save returns: the same file, in memory."""
    return _save.to_bytes(tensors, "pt", metadata)


def load(data: bytes) -> Dict[str, Any]:
    """The tensors of a safetensors file held in `data` (what safetensors.torch.load takes): CPU
    tensors owning their memory."""
    return load_bytes(data, "pt")


def _is_complete(t: Any) -> bool:
    """Whether `t` covers its whole storage (so that saving it saves every shared byte)."""
    ptr, size = _save._storage(t)
    return t.data_ptr() == ptr and t.numel() * t.element_size() == size


def _names_to_drop(state: Dict[str, Any], preferred: Set[str]) -> Dict[str, List[str]]:
    """For each group of names sharing memory (tied weights), the one name kept and the others,
    chosen as safetensors chooses: among the names covering the whole storage, the first in
    sorted order, preferring names in `preferred` (those a file holds, when loading)."""
    dropped: Dict[str, List[str]] = {}
    for names in _save._shared_groups(state):
        if len(names) < 2:
            continue
        whole = sorted(n for n in names if _is_complete(state[n]))
        if not whole:
            raise RuntimeError(
                f"ferry: the tensors {sorted(names)} share memory and none of them covers all of "
                f"it, so no one name can be saved for the group; clone them apart (or save the "
                f"whole storage under one name)")
        keep = next((n for n in whole if n in preferred), whole[0])
        dropped[keep] = sorted(n for n in names if n != keep)
    return dropped


def save_model(model: Any, filename: Union[str, "os.PathLike[str]"],
               metadata: Optional[Dict[str, str]] = None, force_contiguous: bool = False) -> None:
    """Saves ``model.state_dict()`` as safetensors.torch.save_model does: of tensors sharing
    memory (tied weights) one name is saved, and each dropped name is recorded in the metadata
    as ``{dropped: kept}`` (unless the caller's metadata has that key); ``force_contiguous``
    makes strided tensors contiguous first."""
    state = model.state_dict()
    for keep, names in _names_to_drop(state, set()).items():
        for name in names:
            metadata = dict(metadata or {})
            metadata.setdefault(name, keep)
            del state[name]
    if force_contiguous:
        state = {k: v.contiguous() for k, v in state.items()}
    try:
        save_file(state, filename, metadata=metadata)
    except ValueError as e:
        raise ValueError(f"{e} Or use save_model(..., force_contiguous=True), which copies "
                         f"strided tensors first.") from None


def load_model(model: Any, filename: Union[str, "os.PathLike[str]"], strict: bool = True,
               device: Any = "cpu") -> Tuple[List[str], List[str]]:
    """Loads `filename` into `model` as safetensors.torch.load_model does, tied weights
    included: returns (missing, unexpected) names, and with ``strict`` raises RuntimeError
    naming them when either is not empty."""
    state = load_file(filename, device=device)
    dropped = _names_to_drop(model.state_dict(), set(state))
    missing_keys, unexpected_keys = model.load_state_dict(state, strict=False)
    missing = set(missing_keys)
    unexpected = list(unexpected_keys)
    for names in dropped.values():
        for name in names:
            if name in missing:
                missing.discard(name)  # tied to a name the file holds
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        lines = [f"Error(s) in loading state_dict for {type(model).__name__}:"]
        if missing:
            lines.append("    Missing key(s) in state_dict: " +
                         ", ".join(f'"{k}"' for k in sorted(missing)))
        if unexpected:
            lines.append("    Unexpected key(s) in state_dict: " +
                         ", ".join(f'"{k}"' for k in sorted(unexpected)))
        raise RuntimeError("\n".join(lines))
    return sorted(missing), unexpected


__all__ = ["load", "load_file", "load_model", "save", "save_file", "save_model"]
