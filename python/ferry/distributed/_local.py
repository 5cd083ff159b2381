"""Several GPUs in one process: reads into different GPUs at once, each GPU with workers and
staging memory of its own.

ferry's engine runs every request of a process on one pool of worker threads (the default
runtime's), and a request into GPU memory asks for `nthreads` workers (8 by default). The pool
grows to the largest request's need, not to the sum of the requests in flight: two GPUs read at
once from a pool of 8 threads share those 8, and each gets about half the parallelism it would
have alone. Staging is already per GPU (pinned buffers and a stream kept per device and reused).
``prepare_devices`` sizes the pool for all the GPUs at once (nthreads for each) and makes each
GPU's staging before the first read; ``read_split`` uses it to read one file split across GPUs.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, List, Sequence, Set, Tuple, Union

from .. import _ferry
from ..checkpoint import _framework
from ._plan import ALIGN

_prepared: Set[Tuple[int, int, int]] = set()


def gpu_count() -> int:
    """GPUs the CUDA driver sees (0 without a driver)."""
    status = _ferry.cuda_status()
    return len(status.gpus) if status.available else 0


def parse_devices(devices: Union[str, int, Sequence[Any]]) -> List[int]:
    """GPU ordinals from "all", "0,1", 1, ["cuda:0", 1]...; ValueError for a duplicate or a
    malformed entry. "all" needs a driver (CudaError without one)."""
    if isinstance(devices, str):
        text = devices.strip()
        if text == "all":
            status = _ferry.cuda_status()
            if not status.available:
                from .._errors import CudaError
                raise CudaError(f"ferry.distributed: no GPU ({status.why_not})")
            return list(range(len(status.gpus)))
        items: List[Any] = [t.strip() for t in text.split(",")]
    elif isinstance(devices, int):
        items = [devices]
    else:
        items = list(devices)
    out: List[int] = []
    for item in items:
        text = str(item)
        if text.startswith("cuda:"):
            text = text[5:]
        if not text.isdigit():
            raise ValueError(f"ferry.distributed: {item!r} is not a GPU ordinal (N or cuda:N)")
        n = int(text)
        if n in out:
            raise ValueError(f"ferry.distributed: GPU {n} is named twice in {devices!r}")
        out.append(n)
    if not out:
        raise ValueError("ferry.distributed: no GPU named")
    return out


def prepare_devices(devices: Union[str, Sequence[Any]], nthreads: int = 0) -> None:
    """Readies concurrent reads into every GPU of `devices`: ferry's worker pool gets `nthreads`
    workers (default: the nthreads setting) for each GPU, and each GPU its staging buffers, made
    now rather than by the first read. Cheap when already done for the same GPUs."""
    ordinals = parse_devices(devices)
    per = nthreads or int(_ferry.get_settings()["nthreads"])
    need = min(per * len(ordinals), 256)
    from .._settings import Scope
    for d in ordinals:
        key = (d, per, need)
        if key in _prepared:
            continue
        host = max(int(_ferry.get_settings()["host_nthreads"]), need)
        with Scope({"nthreads": per, "host_nthreads": host}):
            _ferry.warm_up(d)  # the pool grows to max(nthreads, host_nthreads) = need
        _prepared.add(key)


@dataclass
class SplitRead:
    """One file read across GPUs: `arrays[k]` holds part k (on devices[k]); `parts` are the
    (file offset, bytes) of each, `routes` their route reports, `seconds` each part's time and
    `wall` the whole read's."""

    devices: List[int]
    arrays: List[Any]
    parts: List[Tuple[int, int]]
    routes: List[Any] = field(default_factory=list)
    seconds: List[float] = field(default_factory=list)
    wall: float = 0.0

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.parts)

    @property
    def gbps(self) -> float:
        return self.bytes / self.wall / 1e9 if self.wall > 0 else 0.0

    def summary(self) -> str:
        lines = [f"{self.bytes} B into {len(self.devices)} GPU(s) in {self.wall:.4f} s: "
                 f"{self.gbps:.2f} GB/s in all"]
        for d, (o, n), s, r in zip(self.devices, self.parts, self.seconds, self.routes):
            lines.append(f"  GPU {d}: {n} B from offset {o} in {s:.4f} s: "
                         f"{n / s / 1e9 if s else 0:.2f} GB/s, {r.verdict}")
        return "\n".join(lines)


def split_range(offset: int, size: int, parts: int, align: int = ALIGN) -> List[Tuple[int, int]]:
    """[offset, offset + size) cut into `parts` contiguous (offset, bytes), as equal as cuts on
    `align` boundaries of the file allow (the last part takes the remainder)."""
    if parts < 1:
        raise ValueError(f"ferry.distributed: parts must be >= 1, not {parts}")
    cuts = [offset]
    for k in range(1, parts):
        ideal = offset + size * k // parts
        cut = (ideal + align // 2) // align * align
        cuts.append(min(max(cut, cuts[-1]), offset + size))
    cuts.append(offset + size)
    return [(cuts[k], cuts[k + 1] - cuts[k]) for k in range(parts)]


def read_split(path: Any, devices: Union[str, Sequence[Any]], offset: int = 0,
               size: Any = None, framework: str = "pt", prepare: bool = True,
               **settings: Any) -> SplitRead:
    """Reads bytes [offset, offset + size) of `path` (default: to the end) split into one
    contiguous part per GPU, all parts at once, each into a new uint8 array on its GPU
    (`framework` "pt" or "cupy"). `prepare` runs prepare_devices first (prepare=False reads on
    the pool as it is, for comparison). Keyword arguments are ferry settings for the reads."""
    from .. import open as _open
    ordinals = parse_devices(devices)
    if prepare:
        prepare_devices(ordinals, int(settings.get("nthreads", settings.get("threads", 0)) or 0))
    files = [_open(path, "r", **settings) for _ in ordinals]
    try:
        total = files[0].size
        if offset > total:
            raise ValueError(f"ferry.distributed: offset {offset} is past the end of "
                             f"{os.fspath(path)} ({total} B)")
        n = total - offset if size is None else min(int(size), total - offset)
        parts = split_range(offset, n, len(ordinals))
        fws = [_framework(framework, d) for d in ordinals]
        arrays = [fw.raw(p[1]) for fw, p in zip(fws, parts)]
        for fw in fws:
            fw.settle()
        start = time.perf_counter()
        futures = [f.pread(a, p[1], p[0]) for f, a, p in zip(files, arrays, parts)]
        for fut, p in zip(futures, parts):
            got = fut.result()
            if got != p[1]:
                raise EOFError(f"ferry.distributed: {got} B of {p[1]} at offset {p[0]}")
        wall = time.perf_counter() - start
        routes = [fut.last_route for fut in futures]
        return SplitRead(ordinals, arrays, parts, routes, [r.seconds for r in routes], wall)
    finally:
        for f in files:
            f.close()


__all__ = ["SplitRead", "gpu_count", "parse_devices", "prepare_devices", "read_split",
           "split_range"]
