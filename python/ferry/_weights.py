"""``ferry.iter_weights``: a checkpoint's tensors one at a time, in file order, for the loaders of
inference engines, which consume ``(name, tensor)`` pairs and copy each into their own model.

Every tensor yielded has an allocation of its own: nothing is read into it after it is yielded,
and dropping it frees it. Reads run ahead of the consumer within ``memory_budget``: the tensors
allocated but not yet yielded, plus ferry's pinned staging where the destination is a GPU, never
exceed it (one tensor larger than the budget is read alone). The tensors are read in batches, one
gathered request (``Checkpoint.start_read_into``) per batch, two batches at a time, each started
from this thread as soon as it fits, before the tensor that made room is handed out.

``shard=`` gives each tensor a rule (``Shard``: dimension, rank, world size, fused sub-blocks)
and the rank reads only its slice's bytes: one range per contiguous run of the slice in the file.
``evict=True`` drops each file's pages from the page cache once its tensors are read.
docs/engines.md has the guarantees and a loader sketch.
"""

from __future__ import annotations

import operator
import os
import time
from collections import deque
from typing import (Any, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, NamedTuple,
                    Optional, Sequence, Tuple, Union)

from . import _ferry
from ._errors import IoError
from .checkpoint import (_PACKED, Checkpoint, CheckpointError, PendingRead, _convert, _Entry,
                         _framework, _target_dtype, _Torch)

# `import ferry` imports this module: it keeps to what ferry imports anyway (no dataclasses, no
# ferry.distributed, whose tensor_split cut is imported when a tensor is sliced).

DEFAULT_BUDGET = 256 << 20
# A batch (one read_into call) holds at most half the budget, so that the next one reads while
# the consumer takes the tensors of this one, and at most this much; at most _IN_FLIGHT batches
# read at once.
_BATCH_CAP = 1 << 30
_IN_FLIGHT = 2


class Shard(NamedTuple):
    """A rank's slice of a tensor along `dim`: part `rank` of `world`, cut as
    ``torch.tensor_split(t, world, dim)[rank]`` cuts it (the first ``size % world`` ranks get one
    more). `blocks`: the sizes along `dim` of a fused tensor's sub-blocks (QKV: ``(q, k, v)``;
    gate-up: ``(i, i)``), each cut so and the rank's parts joined in block order."""

    dim: int
    rank: int
    world: int
    blocks: Optional[Tuple[int, ...]] = None


ShardRule = Union[Shard, Mapping[str, Optional[Shard]],
                  Callable[[str, Tuple[int, ...]], Optional[Shard]]]
Names = Union[Iterable[str], Callable[[str], bool], None]


class WeightsReport:
    """How an ``iter_weights`` pass went, so far (it fills in as the tensors are yielded):
    ``tensors``; ``bytes_read`` (asked of storage: the tensors' or their slices'); ``budget``;
    ``staging_bytes`` (ferry's pinned staging counted against it, into a GPU only);
    ``peak_ahead_bytes`` (the most allocated and not yet yielded at once); into a CUDA device
    through torch, ``reserved_peak_bytes`` (the most torch's caching allocator reserved beyond its
    reservation at the start and what the consumer kept: the driver's side of the budget; None
    elsewhere), ``reservation_unwatched`` (why not, into a CUDA device through torch, where it
    is not held: another allocator backend, or asking it failed), ``allocator_waits`` (reads
    held back because the allocator would have reserved past the budget), ``cache_releases``
    (``torch.cuda.empty_cache()`` calls made for it) and ``allocator_seconds`` (the time spent
    asking the allocator); ``evicted_bytes`` and
    ``evicted_files`` (evict=True), with ``evict_unmeasured`` saying why the bytes are a lower
    bound, if they are; ``seconds``; ``loads``, each batch's LoadReport."""

    def __init__(self, budget: int, staging_bytes: int) -> None:
        self.tensors = self.bytes_read = self.peak_ahead_bytes = 0
        self.budget, self.staging_bytes = budget, staging_bytes
        self.reserved_peak_bytes: Optional[int] = None
        self.reservation_unwatched = ""
        self.allocator_waits = self.cache_releases = 0
        self.allocator_seconds = 0.0
        self.evicted_bytes = self.evicted_files = 0
        self.evict_unmeasured = ""
        self.seconds = 0.0
        self.loads: List[Any] = []

    def to_dict(self) -> Dict[str, Any]:
        """The fields but ``loads``."""
        return {k: v for k, v in vars(self).items() if k != "loads"}

    def __repr__(self) -> str:
        return "WeightsReport(" + ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items()) + ")"


class _Item:
    """One tensor to read: its result (name, dtype, shape; nbytes the result's) and the runs
    (begin, length) of the tensor's bytes it takes, laid out back to back."""

    __slots__ = ("entry", "runs", "last_of_file")

    def __init__(self, entry: _Entry, runs: List[Tuple[int, int]]) -> None:
        self.entry, self.runs, self.last_of_file = entry, runs, False


class _Batch:
    """Tensors read by one gathered request: their memory, and the read until it is waited for."""

    __slots__ = ("items", "raws", "pending")

    def __init__(self, items: List[_Item], raws: List[Any], pending: PendingRead) -> None:
        self.items: Deque[_Item] = deque(items)
        self.raws: Deque[Any] = deque(raws)
        self.pending: Optional[PendingRead] = pending


def _where(ckpt: Checkpoint, entry: _Entry) -> str:
    return f"ferry: {_ferry.shown_path(ckpt.shards[entry.shard])}: tensor '{entry.name}'"


def _runs(shape: Tuple[int, ...], itemsize: int,
          spans: List[List[Tuple[int, int]]]) -> List[Tuple[int, int]]:
    """The runs (begin, length) of a tensor's bytes that hold the box `spans` picks (per
    dimension, sorted disjoint index ranges), in the box's row-major order. Trailing dimensions
    taken whole fold into one run; a dim-1 slice of a (4096, 4096) tensor is 4096 runs."""
    unit, d = itemsize, len(shape)
    while d and spans[d - 1] == [(0, shape[d - 1])]:
        unit *= shape[d - 1]
        d -= 1
    if not unit or any(not s for s in spans):
        return []
    if d == 0:
        return [(0, unit)]
    inner = [(a * unit, (b - a) * unit) for a, b in spans[d - 1]]
    bases, stride = [0], unit * shape[d - 1]
    for k in range(d - 2, -1, -1):
        bases = [i * stride + b for a, z in spans[k] for i in range(a, z) for b in bases]
        stride *= shape[k]
    runs = [(b + at, n) for b in bases for at, n in inner]
    if len(bases) > 1 and inner[0][0] == 0 and sum(inner[-1]) == unit * shape[d - 1]:
        joined: List[Tuple[int, int]] = []  # a row's last run meets the next row's first
        for at, n in runs:
            if joined and sum(joined[-1]) == at:
                joined[-1] = (joined[-1][0], joined[-1][1] + n)
            else:
                joined.append((at, n))
        runs = joined
    return runs


def _join(spans: Iterable[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Sorted `spans` without the empty ones, those that meet joined."""
    out: List[Tuple[int, int]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and out[-1][1] >= a:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _part(ckpt: Checkpoint, e: _Entry, spans: List[List[Tuple[int, int]]]) -> _Item:
    """The box `spans` picks of `e`, as an item: its runs and the box's shape."""
    numel = 1
    for d in e.shape:
        numel *= d
    runs = _runs(e.shape, e.nbytes // numel if numel else 0, spans)
    shape = tuple(sum(b - a for a, b in s) for s in spans)
    nbytes = sum(length for _, length in runs)
    return _Item(_Entry(e.index, (e.name, e.dtype, shape, e.file_offset, nbytes, e.shard)), runs)


def _slice(ckpt: Checkpoint, e: _Entry, rule: Shard) -> _Item:
    """The runs of bytes of `rule`'s slice of `e`, in the slice's own (row-major) order."""
    bad = _where(ckpt, e)
    if not isinstance(rule, Shard):
        raise TypeError(f"{bad}: the shard rule gives {rule!r}, not a ferry.Shard or None")
    if not e.shape:
        raise ValueError(f"{bad} is a scalar: it has no dimension to split")
    if e.dtype in _PACKED:
        raise ValueError(f"{bad} is {e.dtype} (packed sub-byte items): it cannot be sliced")
    if not -len(e.shape) <= rule.dim < len(e.shape):
        raise ValueError(f"{bad} has shape {list(e.shape)}: no dimension {rule.dim} to split")
    if rule.world < 1 or not 0 <= rule.rank < rule.world:
        raise ValueError(f"{bad}: rank {rule.rank} of world size {rule.world} is not a rank")
    dim = rule.dim % len(e.shape)
    size = e.shape[dim]
    blocks = tuple(rule.blocks) if rule.blocks is not None else (size,)
    if sum(blocks) != size or any(b < 0 for b in blocks):
        raise ValueError(f"{bad}: sub-blocks {list(blocks)} do not add up to its size {size} "
                         f"along dimension {dim}")
    from .distributed._plan import split_points
    spans, base = [], 0
    for b in blocks:
        cut = split_points(b, rule.world)
        spans.append((base + cut[rule.rank], base + cut[rule.rank + 1]))
        base += b
    box = [[(0, n)] for n in e.shape]
    box[dim] = _join(spans)
    return _part(ckpt, e, box)


def _box(shape: Tuple[int, ...], index: Any, where: str) -> Optional[Tuple[Any, Any]]:
    """(per dimension the sorted ranges `index` touches, the index that picks the result out of
    that box) for an index of ints, slices of positive step, lists of ints, Ellipsis and None;
    None for any other index (a tensor, a mask, a negative step), which the caller applies to
    the whole tensor so that the framework gives its own answer or error."""
    index = index if isinstance(index, tuple) else (index,)
    ellipses = sum(i is Ellipsis for i in index)
    real = sum(i is not None and i is not Ellipsis for i in index)
    if ellipses > 1 or real > len(shape):
        return None
    whole = (slice(None),) * (len(shape) - real)
    if ellipses:
        at = next(k for k, i in enumerate(index) if i is Ellipsis)
        index = index[:at] + whole + index[at + 1:]
    else:
        index = index + whole
    spans: List[List[Tuple[int, int]]] = []
    local: List[Any] = []
    for i in index:
        if i is None:
            local.append(None)
            continue
        size = shape[len(spans)]
        if isinstance(i, slice):
            start, stop, step = i.indices(size)
            if step < 0:
                return None
            picked = range(start, stop, step)
            spans.append([(start, picked[-1] + 1)] if picked else [])
            local.append(slice(0, len(picked) and picked[-1] + 1 - start, step))
        else:  # an int, or a list of them (a bool is a mask, not an int)
            many = isinstance(i, (list, range))
            values = list(i) if many else [i]
            if any(isinstance(v, bool) for v in values):
                return None
            try:
                values = [operator.index(v) for v in values]
            except TypeError:
                return None
            for v in values:
                if not -size <= v < size:
                    raise IndexError(f"{where}: index {v} is out of range for dimension "
                                     f"{len(spans)} (size {size})")
            values = [v % size for v in values]
            spans.append(_join((v, v + 1) for v in values))
            at = {v: k for k, v in enumerate(sorted(set(values)))}  # its place in the box
            local.append([at[v] for v in values] if many else 0)
    return spans, tuple(local)


def read_index(ckpt: Checkpoint, fw: Any, e: _Entry, index: Any) -> Tuple[Any, int]:
    """``tensor[index]`` of `e`, reading only the box of bytes the index touches (one gathered
    request of its runs), and the bytes read. Ranges, ints and lists of ints on any dimension,
    Ellipsis and None are read so; any other index reads the whole tensor and applies it."""
    where = _where(ckpt, e)
    if e.dtype in _PACKED:
        raise TypeError(f"{where} is {e.dtype} (packed): slice its bytes after get_tensor")
    box = _box(e.shape, index, where) if e.shape else None
    spans, local = box if box is not None else ([[(0, n)] for n in e.shape], index)
    item = _part(ckpt, e, spans)
    raw = fw.raw(item.entry.nbytes)
    fw.settle()
    if item.runs:
        ckpt.start_read_into([(e.name, raw, item.runs)]).result()
    return fw.view(raw, item.entry)[local], item.entry.nbytes


def _choose(ckpt: Checkpoint, names: Names, shard: Optional[ShardRule]) -> List[_Item]:
    """The tensors to read, in file order, each with its slice."""
    entries = list(ckpt.entries.values())
    if callable(names):
        entries = [e for e in entries if names(e.name)]
    elif names is not None:
        wanted = {ckpt.entry(n).index for n in ([names] if isinstance(names, str) else names)}
        entries = [e for e in entries if e.index in wanted]
    if isinstance(shard, Mapping):
        missing = sorted(n for n in shard if n not in ckpt.entries)
        if missing:
            raise CheckpointError(f"ferry: {_ferry.shown_path(ckpt.path)}: shard= names tensors "
                                  f"the checkpoint lacks: {', '.join(map(repr, missing[:8]))}")
    items = []
    for e in entries:
        if isinstance(shard, Shard):
            rule: Optional[Shard] = shard
        elif isinstance(shard, Mapping):
            rule = shard.get(e.name)
        elif shard is not None:
            rule = shard(e.name, e.shape)
        else:
            rule = None
        items.append(_Item(e, [(0, e.nbytes)] if e.nbytes else []) if rule is None
                     else _slice(ckpt, e, rule))
    for k, item in enumerate(items):
        item.last_of_file = k + 1 == len(items) or items[k + 1].entry.shard != item.entry.shard
    return items


def _setting(settings: Mapping[str, Any], name: str) -> int:
    """A setting in force with this call's overrides."""
    from ._settings import settings as current
    with current(**{k: v for k, v in settings.items() if k != "direct"}):
        return int(current[name])


# Into a GPU, the staging takes at most this share of the budget where neither the caller nor the
# environment chose bounce_buffer_size: the iterator's reads then use smaller bounce buffers (down
# to _MIN_BOUNCE), which leaves more of the budget for tensors read ahead (bench/NOTES.md §49).
_STAGING_SHARE = 8
_MIN_BOUNCE = 1 << 20


def _bounce_for(budget: int, settings: Mapping[str, Any]) -> Optional[int]:
    """The bounce_buffer_size the iterator's reads into a GPU use, where the setting is ferry's
    default and a smaller one keeps the staging within budget / _STAGING_SHARE; else None."""
    if "bounce_buffer_size" in settings:
        return None
    from ._settings import settings as current
    if any(r["name"] == "bounce_buffer_size" and r["source"] != "default"
           for r in current.describe()):
        return None
    bounce = _setting(settings, "bounce_buffer_size")
    chosen = bounce
    while _setting(settings, "nthreads") * 2 * chosen > budget // _STAGING_SHARE \
            and chosen // 2 >= _MIN_BOUNCE:
        chosen //= 2
    return chosen if chosen != bounce else None


class _TorchCache:
    """What the iterator asks of torch's CUDA caching allocator on its device: the bytes reserved
    and allocated, the free blocks an allocation on the current stream may take, and the rules
    by which a request takes one or makes a new segment (c10/cuda/CUDACachingAllocator.cpp): sizes
    round up to 512 bytes; a request up to 1 MiB comes from the small pool's 2 MiB segments; a
    larger one from the smallest free block that holds it, split when more than 1 MiB is left,
    else from a new segment of 20 MiB (under 10 MiB) or of its size rounded up to 2 MiB. The
    tests' double scales these sizes down (bench/NOTES.md §50)."""

    MIN_BLOCK, SMALL, SMALL_SEGMENT = 512, 1 << 20, 2 << 20
    MIN_LARGE, LARGE_SEGMENT, ROUND_LARGE = 10 << 20, 20 << 20, 2 << 20

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.device = torch, device
        self.index = device.index if device.index is not None else torch.cuda.current_device()

    def stats(self) -> Tuple[int, int]:
        """(reserved, allocated) bytes on the device; both 0 before the allocator's first use,
        when torch has no stats for it (an empty dict)."""
        s = self.torch.cuda.memory_stats_as_nested_dict(self.index)
        return tuple(s.get(k, {}).get("all", {}).get("current", 0)  # type: ignore[return-value]
                     for k in ("reserved_bytes", "allocated_bytes"))

    def free_blocks(self) -> "_FreeBlocks":
        """The allocator's free blocks on the device, from one snapshot."""
        cuda = self.torch.cuda
        try:
            segments = cuda.memory_snapshot(include_traces=False)  # torch >= 2.10: no traces
        except TypeError:
            segments = cuda.memory_snapshot()
        stream = cuda.current_stream(self.device).cuda_stream
        free = _FreeBlocks()
        for seg in segments:
            if seg.get("device") != self.index \
                    or tuple(seg.get("segment_pool_id") or (0, 0)) != (0, 0):
                continue
            blocks = [b["size"] for b in seg["blocks"] if b["state"] == "inactive"]
            free.add(seg.get("segment_type") == "small", seg.get("stream", 0) == stream,
                     blocks, whole=len(blocks) == len(seg["blocks"]))
        return free

    def release(self) -> None:
        with self.torch.cuda.device(self.index):
            self.torch.cuda.empty_cache()

    def rounded(self, n: int) -> int:
        return max(self.MIN_BLOCK, -(-n // self.MIN_BLOCK) * self.MIN_BLOCK)

    def segment(self, n: int) -> int:
        """The segment a request of `n` bytes makes when no free block holds it."""
        if n <= self.SMALL:
            return self.SMALL_SEGMENT
        if n < self.MIN_LARGE:
            return self.LARGE_SEGMENT
        return -(-n // self.ROUND_LARGE) * self.ROUND_LARGE

    def bound(self, sizes: Sequence[int]) -> int:
        """The most that allocating `sizes` can add to the reservation: a new segment for each
        large request, and for the small ones at most one 2 MiB segment per MiB (each holds
        1 MiB or more of them) and one more."""
        large = sum(self.segment(n) for n in sizes if n > self.SMALL)
        small = [n for n in sizes if 0 < n <= self.SMALL]
        return large + min(len(small), sum(small) // self.SMALL + 1) * self.SMALL_SEGMENT

    def growth(self, sizes: Sequence[int], free: "_FreeBlocks", released: bool = False) -> int:
        """What allocating `sizes` in order adds to the reservation, by the allocator's rules over
        the `free` blocks; `released`: after the wholly free segments are given back."""
        pools = free.pools(released)
        added = 0
        for n in sizes:
            if not n:
                continue
            n = self.rounded(n)
            small = n <= self.SMALL
            pool, keep = pools[small], 0 if small else self.SMALL
            fits = [b for b in pool if b >= n]
            if fits:
                block = min(fits)
                pool.remove(block)
            else:
                block = self.segment(n)
                added += block
            if block - n > keep and (keep or block - n >= self.MIN_BLOCK):
                pool.append(block - n)
        return added


class _FreeBlocks:
    """The free blocks of one snapshot of the allocator: those an allocation on the current
    stream may take, by pool (small or large) and by whether their segment is wholly free, and
    the bytes of the wholly free segments, which ``torch.cuda.empty_cache()`` gives back."""

    def __init__(self) -> None:
        self.blocks: Dict[Tuple[bool, bool], List[int]] = {(False, False): [], (False, True): [],
                                                           (True, False): [], (True, True): []}
        self.releasable = 0

    def add(self, small: bool, usable: bool, blocks: List[int], whole: bool) -> None:
        if usable:
            self.blocks[small, whole].extend(blocks)
        if whole:
            self.releasable += sum(blocks)

    def pools(self, released: bool) -> Dict[bool, List[int]]:
        """Copies of the (large, small) free lists, without the wholly free segments' if
        `released`."""
        return {small: self.blocks[small, False] + ([] if released else self.blocks[small, True])
                for small in (False, True)}


class _Reservation:
    """Holds torch's reservation on the device, beyond what it was at the start and what the
    consumer keeps, within the budget. A batch whose allocation would reserve past it goes once
    the allocator's wholly free segments are given back, if that makes room; else it waits while
    reads are ahead (their tensors, once handed out and dropped, free the blocks it needs); with
    nothing ahead, the free segments are given back first (bench/NOTES.md §50)."""

    # Asking stops where it costs more than MAX_SHARE of the pass, the pass being what has run
    # so far or what `nbytes` take at FAST bytes a second, whichever is longer; from the second
    # question on. A snapshot lists every segment of the process (H100: 0.15 ms at 60 segments,
    # 0.9 ms at 356, 2.4 ms at 1,023, 3.6 ms at 1,428; bench/NOTES.md §50, §57), and an engine's
    # process may hold thousands: at 1,023 a 1.6 GiB pass spent 39 ms of its 65 asking 16
    # questions. The bench's 4 GiB model in a fresh process spends 7-9% of its pass asking.
    MAX_SHARE, MIN_QUESTIONS, FAST = 0.2, 2, 50e9

    def __init__(self, cache: Any, budget: int, nbytes: int, report: WeightsReport) -> None:
        self.cache, self.budget, self.watching = cache, budget, True
        self.too_costly = False  # stopped for asking's cost: the iterator halves read-ahead
        self.r0 = self.a0 = self.questions = 0
        self.began = time.perf_counter()
        self.expected = nbytes / self.FAST
        self._asking(report, lambda: self._start())

    def _start(self) -> bool:
        self.r0, self.a0 = self.cache.stats()
        return True

    def _asking(self, report: WeightsReport, question: Callable[[], Any]) -> Any:
        """`question`'s answer, or True once the pass goes on unwatched: asking failed (the report
        and a warning say why: torch's internals moved, most likely), or asking has cost more
        than MAX_SHARE of the pass (the report says so; the iterator halves its read-ahead)."""
        if not self.watching:
            return True
        start = time.perf_counter()
        try:
            return question()
        except Exception as e:  # noqa: BLE001 - any failure of torch's introspection
            self.watching = False
            report.reservation_unwatched = f"asking torch's caching allocator failed: {e!r}"
            import warnings
            warnings.warn(f"ferry.iter_weights: {report.reservation_unwatched}; torch's "
                          "reservation is not held to the budget in this pass", RuntimeWarning,
                          stacklevel=4)
            return True
        finally:
            now = time.perf_counter()
            report.allocator_seconds += now - start
            self.questions += 1
            if self.watching and self.questions >= self.MIN_QUESTIONS and \
                    report.allocator_seconds > self.MAX_SHARE * max(now - self.began,
                                                                    self.expected):
                self.watching, self.too_costly = False, True
                report.reservation_unwatched = (
                    f"asking torch's caching allocator took {report.allocator_seconds:.3f} s of "
                    f"the pass's {now - self.began:.3f} s ({self.questions} questions): stopped "
                    f"asking, and read-ahead held to half the budget instead")

    def admit(self, sizes: Sequence[int], ahead: int, report: WeightsReport) -> bool:
        """Whether the batch of `sizes` may be allocated now, `ahead` bytes being ahead. Asks the
        allocator's stats, and its free blocks only when the stats cannot settle it."""
        return bool(self._asking(report, lambda: self._admit(sizes, ahead, report)))

    def _admit(self, sizes: Sequence[int], ahead: int, report: WeightsReport) -> bool:
        reserved, allocated = self.note(ahead, report)
        room = self.budget + max(0, allocated - self.a0 - ahead) - (reserved - self.r0)
        if self.cache.bound(sizes) <= room:
            return True
        large = [self.cache.rounded(n) for n in sizes if n > self.cache.SMALL]
        cached = reserved - allocated  # what giving back every free segment could add
        if not large or max(large) <= cached or self.cache.segment(max(large)) <= room + cached:
            free = self.cache.free_blocks()
            if self.cache.growth(sizes, free) <= room:
                return True
            # Giving the wholly free segments back first makes room (a device sync, but no
            # wait for the consumer): one release ends a pattern that would wait a layer.
            if free.releasable and \
                    self.cache.growth(sizes, free, released=True) <= room + free.releasable:
                self.cache.release()
                report.cache_releases += 1
                return True
        # else no free block holds the largest request, and its new segment is past the room
        # however much is given back
        if ahead:
            report.allocator_waits += 1
            return False
        if reserved > allocated:
            self.cache.release()
            report.cache_releases += 1
        return True

    def finish(self, ahead: int, report: WeightsReport) -> None:
        """The last look at the reservation, after the last allocation."""
        self._asking(report, lambda: self.note(ahead, report))

    def note(self, ahead: int, report: WeightsReport) -> Tuple[int, int]:
        """Records the reservation beyond the start's and what the consumer kept, `ahead` bytes
        being ahead, and returns the allocator's (reserved, allocated). Between two calls only a
        new segment grows the reservation, so a call before each allocation and one at the end
        see its peak."""
        reserved, allocated = self.cache.stats()
        over = reserved - self.r0 - max(0, allocated - self.a0 - ahead)
        report.reserved_peak_bytes = max(report.reserved_peak_bytes or 0, over)
        return reserved, allocated


def _cache_of(fw: Any) -> Tuple[Optional[_TorchCache], str]:
    """The caching allocator behind `fw`'s allocations, where the iterator holds it to the budget
    (torch's on a CUDA device), or None and why not, where the device's memory is not held so
    ("" for host memory and other frameworks, whose allocations are what they are)."""
    if not isinstance(fw, _Torch) or fw.host or fw.device.type != "cuda":
        return None, ""
    torch = fw.torch
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") not in ("", "0"):
        return None, "torch's caching allocator is off (PYTORCH_NO_CUDA_MEMORY_CACHING)"
    backend = getattr(torch.cuda, "get_allocator_backend", lambda: "native")()
    if backend != "native":
        return None, f"torch's CUDA allocator is {backend!r}, not the caching allocator"
    return _TorchCache(torch, fw.device), ""


def _staging_bytes(settings: Mapping[str, Any]) -> int:
    """ferry's pinned staging behind reads into a GPU: two bounce buffers per worker thread, as
    the settings in force with this call's overrides make them."""
    return _setting(settings, "nthreads") * 2 * _setting(settings, "bounce_buffer_size")


def _cut_tail(targets: List[Tuple[Any, ...]], tail: int, piece: int) -> List[Tuple[Any, ...]]:
    """`targets` with their last `tail` bytes in runs of at most `piece`. The workers take a
    request's tasks in order from one counter, so with task-sized runs at the end they finish up
    to a task apart, the first ones idle meanwhile; with smaller last runs, a piece apart. A batch
    no read can follow (the next tensor does not fit beside it) pays that tail whole (bench/NOTES.md
    §36)."""
    out: List[Tuple[Any, ...]] = []
    for k in range(len(targets) - 1, -1, -1):
        if len(targets[k]) == 3:  # a slice's runs, each small
            out.append(targets[k])
            tail -= sum(n for _, n in targets[k][2])
            continue
        name, raw, begin, length, at = targets[k]
        if tail <= 0 or length <= piece:
            out.append(targets[k])
        else:
            keep = max(0, length - tail)
            for b in range(length, keep, -piece):
                n = min(piece, b - keep)
                out.append((name, raw, begin + b - n, n, at + b - n))
            if keep:
                out.append((name, raw, begin, keep, at))
        tail -= length
    out.reverse()
    return out


def _name_tensor(e: IoError, ckpt: Checkpoint, items: List[_Item]) -> None:
    """Adds to a failed read's message the tensor whose bytes were at the failing offset."""
    for it in items:
        if os.fsdecode(ckpt.shards[it.entry.shard]) != os.fsdecode(e.filename or ""):
            continue
        base = it.entry.file_offset
        if any(base + b <= e.offset < base + b + n for b, n in it.runs):
            e.strerror = f"{e.strerror}; reading tensor '{it.entry.name}'"
            return


class WeightIterator:
    """The iterator ``iter_weights`` returns: ``(name, tensor)`` pairs, and ``report``."""

    def __init__(self, source: Any, device: Any, names: Names, memory_budget: Optional[int],
                 shard: Optional[ShardRule], evict: bool, framework: str,
                 settings: Dict[str, Any]) -> None:
        budget = DEFAULT_BUDGET if memory_budget is None else int(memory_budget)
        if evict and "://" in str(source):
            raise ValueError(f"ferry: evict=True drops local files' pages; {source!s} is a URL")
        self._fw = _framework(framework, device)
        bounce = None if self._fw.host else _bounce_for(budget, settings)
        if bounce is not None:
            settings = dict(settings, bounce_buffer_size=bounce)
        self._ckpt = Checkpoint(source, **settings)
        self._items = _choose(self._ckpt, names, shard)
        staging = 0 if self._fw.host else _staging_bytes(settings)
        if budget - staging < 1:
            raise ValueError(f"ferry: memory_budget={budget} leaves nothing for tensors after "
                             f"ferry's pinned staging of {staging} bytes (nthreads x 2 x "
                             f"bounce_buffer_size): give a larger budget or smaller settings")
        self._limit = budget - staging
        # A worker's round of tasks: what _cut_tail cuts finer at the end of each batch.
        workers = _setting(settings, "host_nthreads" if self._fw.host else "nthreads")
        self._task = _setting(settings, "task_size")
        self._round = workers * self._task
        self._evict = evict
        self._budget = budget
        self.report = WeightsReport(budget=budget, staging_bytes=staging)
        self._started = False

    def __iter__(self) -> Iterator[Tuple[str, Any]]:
        if self._started:
            raise RuntimeError("ferry: an iter_weights iterator can be iterated once")
        self._started = True
        return self._run()

    def _run(self) -> Iterator[Tuple[str, Any]]:
        start = time.perf_counter()
        self._todo: Deque[_Item] = deque(self._items)
        self._batches: Deque[_Batch] = deque()
        self._ahead = 0  # bytes allocated and not yet yielded
        report = self.report
        cache, report.reservation_unwatched = _cache_of(self._fw)
        self._reserve = None if cache is None else _Reservation(
            cache, self._budget, sum(it.entry.nbytes for it in self._items), report)
        try:
            self._fill()
            while self._batches:
                batch = self._batches[0]
                if batch.pending is not None:
                    try:
                        report.loads.append(batch.pending.result())
                    except IoError as e:
                        _name_tensor(e, self._ckpt, list(batch.items))
                        raise
                    batch.pending = None
                # The batch lets go of each tensor as it is yielded. Reads that fit beside it
                # start before the consumer takes it, so that its work overlaps them; it leaves
                # the count once the consumer is back (who may hold the one before meanwhile).
                it, raw = batch.items.popleft(), batch.raws.popleft()
                if not batch.items:
                    self._batches.popleft()
                self._fill()
                if it.last_of_file and self._evict:
                    self._drop_pages(self._ckpt.shards[it.entry.shard])
                report.tensors += 1
                report.seconds = time.perf_counter() - start
                tensor = self._fw.view(raw, it.entry)
                del raw
                yield it.entry.name, tensor
                del tensor
                self._ahead -= it.entry.nbytes
                self._fill()
            if self._reserve is not None:
                self._reserve.finish(self._ahead, report)
        finally:
            self._batches.clear()  # each unwaited read waits for its bytes as it is dropped

    def _fill(self) -> None:
        """Starts batches while they fit the budget (one, whatever its size, when nothing is
        ahead), _IN_FLIGHT at most."""
        todo, report = self._todo, self.report
        while todo and len(self._batches) < _IN_FLIGHT:
            batch_bytes = max(1, min(self._limit // 2, _BATCH_CAP))
            take, need = 1, todo[0].entry.nbytes
            while take < len(todo) and need + todo[take].entry.nbytes <= batch_bytes:
                need += todo[take].entry.nbytes
                take += 1
            if self._ahead and self._ahead + need > self._limit:
                break
            if self._reserve is not None:
                admitted = self._reserve.admit([todo[k].entry.nbytes for k in range(take)],
                                               self._ahead, report)
                if not self._reserve.watching:  # unwatched from now on: see its reason
                    if self._reserve.too_costly:
                        self._limit = min(self._limit, self._budget // 2)
                    self._reserve = None
                    continue  # the batch again, under the limit in force now
                if not admitted:
                    break
            self._batches.append(self._start([todo.popleft() for _ in range(take)]))
            self._ahead += need
            report.peak_ahead_bytes = max(report.peak_ahead_bytes, self._ahead)
            report.bytes_read += need

    def _start(self, items: List[_Item]) -> _Batch:
        """Allocates `items` and starts their read: one gathered request, one target per run."""
        raws = [self._fw.raw(it.entry.nbytes) for it in items]
        self._fw.settle()  # the consumer queued work between batches
        targets: List[Tuple[Any, ...]] = []
        for it, raw in zip(items, raws):
            if len(it.runs) > 16:  # a slice's runs: one target, no Python tuple a run
                targets.append((it.entry.name, raw, it.runs))
                continue
            at = 0
            for begin, length in it.runs:  # one view of `raw` for all (bind_checkpoint.cc)
                targets.append((it.entry.name, raw, begin, length, at))
                at += length
        if sum(it.entry.nbytes for it in items) > self._round:
            targets = _cut_tail(targets, self._round, max(self._task // 4, 256 << 10))
        return _Batch(items, raws, self._ckpt.start_read_into(targets))

    def _drop_pages(self, path: str) -> None:
        """posix_fadvise(DONTNEED) over the whole file, measured by ferry's page-cache
        residency (cachestat, else mincore) before and after."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            before = _ferry.page_cache_residency(fd, 0, None, True)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            after = _ferry.page_cache_residency(fd, 0, None, True)
        finally:
            os.close(fd)
        self.report.evicted_files += 1
        if before.known and after.known:
            self.report.evicted_bytes += max(0, before.resident - after.resident)
        else:
            self.report.evict_unmeasured = before.why_not or after.why_not


def iter_weights(source: Any, device: Any = "cpu", names: Names = None,
                 memory_budget: Optional[int] = None, shard: Optional[ShardRule] = None, *,
                 evict: bool = False, framework: str = "pt",
                 **settings: Any) -> WeightIterator:
    """``(name, tensor)`` of a checkpoint (a .safetensors file, a folder of shards, an index or a
    URL) in file order, each as it lands in `device` ("cpu", "cuda", "cuda:N" or an ordinal).
    `names`: the tensors to read (a list of names, or a predicate on the name); `memory_budget`:
    bytes of read-ahead (tensors not yet yielded, plus pinned staging into a GPU), 256 MiB by
    default; `shard`: a ``Shard`` for every tensor, or a mapping name -> Shard (or None), or a
    callable (name, shape) -> Shard or None; `evict`: drop each file's pages from the page cache
    once its tensors are read. Keyword arguments override ferry's settings. The iterator's
    ``report`` (a WeightsReport) says what was read, how far ahead and what was evicted."""
    return WeightIterator(source, device, names, memory_budget, shard, evict, framework, settings)


def load_sharded(source: Any, device: Any, framework: str, dtype: Any, names: Names,
                 shard: ShardRule, refused: Any, settings: Dict[str, Any]) -> Dict[str, Any]:
    """``load_checkpoint(..., shard=)``: every chosen tensor's slice, read without a budget.
    `refused`: one_allocation or progress, which a sharded load does not take."""
    if refused:
        raise ValueError("ferry: load_checkpoint(shard=...) takes neither one_allocation nor "
                         "progress")
    fw = _framework(framework, device)
    target = _target_dtype(fw, dtype)
    it = WeightIterator(source, device, names, 1 << 62, shard, False, framework, settings)
    out = dict(it)
    if target is not None:
        _convert(out, fw, target, {i.entry.name: i.entry.dtype for i in it._items})
    return out


__all__: Sequence[str] = ["Shard", "WeightIterator", "WeightsReport", "iter_weights"]
