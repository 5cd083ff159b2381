"""ferry's stager for ``dcp.async_save`` (``ferry.dcp.Stager``), here without torch's DCP so that
torch 1.x can test it: ``stage()`` queues every GPU tensor's copy into ferry's pinned pool
(kept across saves) on ferry's own stream and returns a Future at once; the Future's state dict
holds views of the pool, ready once the copies landed (docs/training.md "Asynchronous saves")."""
from __future__ import annotations

import copy
import gc
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Tuple

import torch

from . import _ferry

__all__ = ["Stager"]


class Stager:
    """Stages a state dict into pinned host memory that is kept from one save to the next.

    ``stage(state_dict)`` returns a ``concurrent.futures.Future`` at once; its result is a state
    dict of the same structure whose tensors are CPU views of the pool (other values deep-copied).
    The caller may change the tensors again once the copies landed: after
    ``response.staging_completion.result()`` of ``dcp.async_save``, ``synchronize_staging()`` or
    the Future's ``result()``. The next ``stage()`` waits (up to ``wait_for_previous_s``) until the
    previous save has dropped its staged state dict, since both share the pool; ``close()``
    frees the pool.
    """

    _synchronize_after_execute = False

    def __init__(self, wait_for_previous_s: float = 600.0) -> None:
        self.wait_for_previous_s = wait_for_previous_s
        self._pool = _ferry.AsyncStagingPool()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferry-stager")
        self._landed: "Future[None] | None" = None
        self._closed = False

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    def stage(self, state_dict: Dict[str, Any]) -> "Future[Dict[str, Any]]":
        if self._closed:
            raise RuntimeError("ferry.dcp.Stager: stage() after close()")
        rows: List[Tuple[str, int, int]] = []
        keep: List[torch.Tensor] = []  # contiguous copies of views, alive until the copies land
        devices = set()

        def collect(key: str, value: Any) -> Any:
            if isinstance(value, dict):
                return {k: collect(f"{key}.{k}" if key else str(k), v) for k, v in value.items()}
            if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
                items = [collect(f"{key}.{i}", v) for i, v in enumerate(value)]
                return items if isinstance(value, list) else tuple(items)
            if not isinstance(value, torch.Tensor):
                return _Leaf(copy.deepcopy(value))
            if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
                raise TypeError(f"ferry.dcp.Stager: '{key}' is a {type(value).__name__}; ferry "
                                f"stages plain tensors (DTensor and ShardedTensor not yet)")
            if value.layout != torch.strided or value.device.type not in ("cpu", "cuda"):
                raise TypeError(f"ferry.dcp.Stager: tensor '{key}' is {value.layout} on "
                                f"{value.device}; ferry stages dense CPU and CUDA tensors")
            t = value.detach()
            if not t.is_contiguous():
                t = t.contiguous()
            if t.device.type == "cuda":
                devices.add(t.device.index if t.device.index is not None else 0)
            keep.append(t)
            nbytes = t.numel() * t.element_size()
            rows.append((key, t.data_ptr() if nbytes else 0, nbytes))
            return _Slot(len(rows) - 1, t.dtype, tuple(t.shape), nbytes)

        layout = collect("", state_dict)
        after = [(d, torch.cuda.current_stream(d).cuda_stream) for d in sorted(devices)]
        try:
            staging = self._pool.stage(rows, after, 0.0)
        except Exception as e:  # ferry's Error
            if "still in use" not in str(e):
                raise
            gc.collect()  # a staged state dict in a reference cycle
            staging = self._pool.stage(rows, after, self.wait_for_previous_s)
        staged = _rebuild(layout, staging)
        landed: "Future[None]" = Future()
        self._landed = landed

        def finish() -> Dict[str, Any]:
            try:
                staging.wait()
            except BaseException as e:
                landed.set_exception(e)
                raise
            landed.set_result(None)
            keep.clear()
            return staged

        return self._executor.submit(finish)

    def synchronize_staging(self) -> None:
        """Waits until the last stage's copies have landed (then the tensors may change)."""
        if self._landed is not None:
            self._landed.result()

    def close(self) -> None:
        """Frees the pinned pool; raises while a staged state dict is still referenced."""
        if self._closed:
            return
        self.synchronize_staging()
        deadline = time.monotonic() + 1.0  # the executor's thread drops its last stage's frame
        while True:
            gc.collect()
            try:
                self._pool.close()
                break
            except Exception as e:  # ferry's Error
                if "still in use" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self._executor.shutdown(wait=True)
        self._closed = True

    def report(self) -> Dict[str, Any]:
        """The pool: ``pinned_bytes``, ``allocations`` (cuMemHostAlloc calls), ``growths``,
        ``stages`` and the last stage's bytes, batches, queue and staging seconds."""
        return dict(self._pool.report())


class _Leaf:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Slot:
    __slots__ = ("index", "dtype", "shape", "nbytes")

    def __init__(self, index: int, dtype: torch.dtype, shape: tuple, nbytes: int) -> None:
        self.index, self.dtype, self.shape, self.nbytes = index, dtype, shape, nbytes


def _rebuild(layout: Any, staging: Any) -> Any:
    if isinstance(layout, dict):
        return {k: _rebuild(v, staging) for k, v in layout.items()}
    if isinstance(layout, list):
        return [_rebuild(v, staging) for v in layout]
    if isinstance(layout, tuple):
        return tuple(_rebuild(v, staging) for v in layout)
    if isinstance(layout, _Leaf):
        return layout.value
    if layout.nbytes == 0:
        return torch.empty(layout.shape, dtype=layout.dtype)
    raw = torch.frombuffer(staging.bytes(layout.index, layout.nbytes), dtype=torch.uint8)
    return raw.view(layout.dtype).view(layout.shape)
