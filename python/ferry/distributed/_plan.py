"""Which rank reads which bytes of a checkpoint, and what the ranks then exchange: pure
functions of the tensors (name, dtype, shape, bytes, in file order) and the number of ranks, so
that every rank computes the same plan without talking to the others, and tests need neither
torch nor a GPU.

Replicated tensors form one stream of bytes in file order (shard after shard). The stream is cut
into one contiguous segment per rank, as long as that rank's quota; a cut that falls inside a
tensor moves to the tensor's nearer edge when that edge is within `tolerance` of the ideal cut
(a whole tensor costs one piece and one exchange op fewer), else the tensor is split there, on an
`align` boundary. Sharded tensors (a plan: name -> dimension) give each rank its slice,
``torch.tensor_split`` style (the first ``size % world`` ranks get one more); a slice that is
contiguous in the file (dimension 0, or every dimension before it of size 1) is read by its owner
straight from storage, any other is read whole by one rank (the least loaded, largest tensors
first) and scattered. Quotas are set by water-filling so that every rank's bytes from storage,
slices and scattered tensors included, come out as equal as the fixed parts allow.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .. import _ferry

ALIGN = 4096  # cuts inside a tensor fall on multiples of this (O_DIRECT-friendly, whole items)
TOLERANCE = 1 / 64  # a cut moves to a tensor edge within this fraction of the per-rank share
BUCKET_BYTES = 64 << 20  # small pieces are packed into exchange buckets of at most this
# Bits per element of every safetensors dtype: ferry's one dtype table (C++).
_BITS = {name: d.bits for name, d in _ferry.safetensors_dtypes().items()}
PACKED = tuple(name for name, bits in _BITS.items() if bits < 8)  # sub-byte kinds, never sliced

ShardPlan = Union[Mapping[str, Optional[int]], Callable[[str, Tuple[int, ...]], Optional[int]]]


@dataclass(frozen=True)
class TensorSpec:
    """What planning needs of one tensor; its position in the list is its index."""

    name: str
    dtype: str
    shape: Tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Piece:
    """Bytes [begin, begin + length) of tensor `tensor`, read from storage by one rank."""

    tensor: int
    begin: int
    length: int

    @property
    def end(self) -> int:
        return self.begin + self.length


@dataclass(frozen=True)
class Slice:
    """How a sharded tensor is cut along `dim`: rank r gets indices [starts[r], starts[r+1]).
    `contiguous` slices are read by their owners; the others by `reader`, then scattered."""

    tensor: int
    dim: int
    starts: Tuple[int, ...]
    contiguous: bool
    reader: int  # -1 for contiguous slices

    def size(self, rank: int) -> int:
        return self.starts[rank + 1] - self.starts[rank]

    def shape(self, spec: TensorSpec, rank: int) -> Tuple[int, ...]:
        return spec.shape[:self.dim] + (self.size(rank),) + spec.shape[self.dim + 1:]

    def nbytes(self, spec: TensorSpec, rank: int) -> int:
        return _inner_bytes(spec, self.dim) * self.size(rank) * _outer(spec, self.dim)

    def byte_range(self, spec: TensorSpec, rank: int) -> Tuple[int, int]:
        """(begin, length) in the tensor of a contiguous slice."""
        assert self.contiguous
        inner = _inner_bytes(spec, self.dim)
        return self.starts[rank] * inner, self.size(rank) * inner


@dataclass(frozen=True)
class Broadcast:
    """One exchange op: rank `src` sends `pieces` (of replicated tensors) to every rank; packed
    ops go through a bucket of `nbytes`, the others straight into the tensor's memory."""

    src: int
    pieces: Tuple[Piece, ...]
    nbytes: int
    packed: bool


@dataclass
class Plan:
    world: int
    tensors: Tuple[TensorSpec, ...]
    replicated: Tuple[int, ...]  # indices of the tensors every rank gets whole
    slices: Dict[int, Slice]  # sharded tensors by index
    pieces: Tuple[Tuple[Piece, ...], ...]  # per rank: replicated bytes it reads for everyone
    slice_reads: Tuple[Tuple[Piece, ...], ...]  # per rank: its own contiguous slices
    scatter_reads: Tuple[Tuple[int, ...], ...]  # per rank: tensors it reads whole to scatter
    quotas: Tuple[int, ...] = field(default=())  # replicated bytes each rank was given

    def storage_bytes(self, rank: int) -> int:
        """Bytes `rank` reads from storage."""
        return (sum(p.length for p in self.pieces[rank])
                + sum(p.length for p in self.slice_reads[rank])
                + sum(self.tensors[i].nbytes for i in self.scatter_reads[rank]))

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def broadcasts(self, bucket_bytes: int = BUCKET_BYTES) -> List[Broadcast]:
        return plan_broadcasts(self.pieces, bucket_bytes)

    def scatters(self) -> List[Slice]:
        """The scatter ops, in tensor order (every rank runs them in this order)."""
        return [self.slices[i] for i in sorted(self.slices) if not self.slices[i].contiguous]

    def exchange_bytes(self, bucket_bytes: int = BUCKET_BYTES) -> Tuple[int, int]:
        """(bytes the sources put on the wire, bytes the ranks receive in all): a broadcast's
        payload counts once, then once per receiving rank; a scatter's, each slice once."""
        payload = delivered = 0
        for b in self.broadcasts(bucket_bytes):
            n = sum(p.length for p in b.pieces)
            payload += n
            delivered += n * (self.world - 1)
        for s in self.scatters():
            spec = self.tensors[s.tensor]
            n = sum(s.nbytes(spec, r) for r in range(self.world) if r != s.reader)
            payload += n
            delivered += n
        return payload, delivered


def _outer(spec: TensorSpec, dim: int) -> int:
    n = 1
    for d in spec.shape[:dim]:
        n *= d
    return n


def _itemsize(spec: TensorSpec) -> int:
    numel = spec.numel
    if numel == 0:
        return max(_BITS.get(spec.dtype, 8) // 8, 1)
    return spec.nbytes // numel


def _inner_bytes(spec: TensorSpec, dim: int) -> int:
    n = _itemsize(spec)
    for d in spec.shape[dim + 1:]:
        n *= d
    return n


def split_points(size: int, world: int) -> Tuple[int, ...]:
    """tensor_split's boundaries of `size` items among `world` parts: the first size % world
    parts get one item more. world + 1 values from 0 to size."""
    base, extra = divmod(size, world)
    return tuple(r * base + min(r, extra) for r in range(world + 1))


def resolve_shard_plan(tensors: Sequence[TensorSpec], plan: Optional[ShardPlan]) -> Dict[int, int]:
    """{tensor index: dimension} from a mapping (name -> dim, None for replicated) or a callable
    (name, shape) -> dim or None. Negative dimensions count from the end. Raises ValueError for
    a name the checkpoint lacks, a scalar, a dimension out of range or a packed dtype."""
    if plan is None:
        return {}
    by_name = {t.name: i for i, t in enumerate(tensors)}
    chosen: Dict[int, Any] = {}
    if callable(plan):
        for i, t in enumerate(tensors):
            dim = plan(t.name, t.shape)
            if dim is not None:
                chosen[i] = dim
    else:
        missing = sorted(n for n in plan if n not in by_name)
        if missing:
            raise ValueError(f"ferry.distributed: the plan names tensors the checkpoint lacks: "
                             f"{', '.join(repr(n) for n in missing[:8])}"
                             f"{' ...' if len(missing) > 8 else ''}")
        for name, dim in plan.items():
            if dim is not None:
                chosen[by_name[name]] = dim
    out: Dict[int, int] = {}
    for i, dim in sorted(chosen.items()):
        t = tensors[i]
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise ValueError(f"ferry.distributed: tensor '{t.name}': the plan gives {dim!r}, "
                             f"not a dimension (an int) or None")
        if not t.shape:
            raise ValueError(f"ferry.distributed: tensor '{t.name}' is a scalar: it has no "
                             f"dimension to split")
        if not -len(t.shape) <= dim < len(t.shape):
            raise ValueError(f"ferry.distributed: tensor '{t.name}' has shape {list(t.shape)}: "
                             f"no dimension {dim} to split")
        if t.dtype in PACKED:
            raise ValueError(f"ferry.distributed: tensor '{t.name}' is {t.dtype} (packed "
                             f"sub-byte items): it cannot be sliced; leave it replicated")
        out[i] = dim % len(t.shape)
    return out


def _water_fill(fixed: Sequence[int], stream: int) -> List[Fraction]:
    """Quotas q (summing to `stream`) that make fixed[r] + q[r] as equal as possible: each rank
    is filled up to one level L, ranks already above it get nothing."""
    n = len(fixed)
    if stream == 0:
        return [Fraction(0)] * n
    order = sorted(range(n), key=lambda r: (fixed[r], r))
    prefix = 0
    level = Fraction(0)
    for k in range(1, n + 1):
        prefix += fixed[order[k - 1]]
        level = Fraction(stream + prefix, k)
        if k == n or level <= fixed[order[k]]:
            break
    return [max(Fraction(0), level - f) for f in fixed]


def _cut_stream(sizes: Sequence[int], cuts: Sequence[int], tolerance: int,
                align: int) -> List[int]:
    """The ideal cuts of a stream of tensors (sizes in order), moved to a tensor edge within
    `tolerance` bytes, else to an `align` boundary inside the tensor; kept non-decreasing."""
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)
    total = starts[-1]
    out: List[int] = []
    prev = 0
    for cut in cuts:
        cut = min(max(cut, 0), total)
        t = bisect.bisect_right(starts, cut) - 1  # the tensor the cut falls in (or starts at)
        if 0 <= t < len(sizes) and starts[t] < cut < starts[t + 1]:
            lo, hi = starts[t], starts[t + 1]
            edge = lo if cut - lo <= hi - cut else hi
            if abs(cut - edge) <= tolerance:
                cut = edge
            else:
                inside = (cut - lo + align // 2) // align * align
                cut = lo + min(max(inside, 0), hi - lo)
        cut = max(cut, prev)
        out.append(cut)
        prev = cut
    return out


def plan_load(tensors: Sequence[TensorSpec], world: int, shard_plan: Optional[ShardPlan] = None,
              *, tolerance: float = TOLERANCE, align: int = ALIGN) -> Plan:
    """The plan for `world` ranks loading `tensors` (in file order): who reads what from
    storage, how sharded tensors are sliced. Deterministic: every rank computes the same one."""
    if world < 1:
        raise ValueError(f"ferry.distributed: world size must be >= 1, not {world}")
    if align < 1:
        raise ValueError(f"ferry.distributed: align must be >= 1, not {align}")
    tensors = tuple(tensors)
    dims = resolve_shard_plan(tensors, shard_plan)
    slices: Dict[int, Slice] = {}
    fixed = [0] * world
    slice_reads: List[List[Piece]] = [[] for _ in range(world)]
    scatter_reads: List[List[int]] = [[] for _ in range(world)]
    strided: List[int] = []
    for i, dim in dims.items():
        spec = tensors[i]
        bounds = split_points(spec.shape[dim], world)
        contiguous = _outer(spec, dim) == 1
        slices[i] = Slice(i, dim, bounds, contiguous, -1)
        if contiguous:
            for r in range(world):
                begin, length = slices[i].byte_range(spec, r)
                if length:
                    slice_reads[r].append(Piece(i, begin, length))
                    fixed[r] += length
        else:
            strided.append(i)
    # Tensors read whole to be scattered: the largest first, each to the least loaded rank.
    for i in sorted(strided, key=lambda i: (-tensors[i].nbytes, i)):
        reader = min(range(world), key=lambda r: (fixed[r], r))
        s = slices[i]
        slices[i] = Slice(i, s.dim, s.starts, False, reader)
        if tensors[i].nbytes:
            fixed[reader] += tensors[i].nbytes
        scatter_reads[reader].append(i)
    for r in range(world):
        scatter_reads[r].sort()
    replicated = tuple(i for i in range(len(tensors)) if i not in dims)
    stream = [i for i in replicated if tensors[i].nbytes > 0]
    sizes = [tensors[i].nbytes for i in stream]
    total_stream = sum(sizes)
    quotas = _water_fill(fixed, total_stream)
    share = Fraction(total_stream + sum(fixed), world)
    tol = max(int(share * Fraction(tolerance)), 0)
    ideal: List[int] = []
    acc = Fraction(0)
    for q in quotas[:-1]:
        acc += q
        ideal.append(int(acc))  # floor: exact for integers, stable across ranks
    cuts = [0] + _cut_stream(sizes, ideal, tol, align) + [total_stream]
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    pieces: List[List[Piece]] = [[] for _ in range(world)]
    for r in range(world):
        lo, hi = cuts[r], cuts[r + 1]
        if lo >= hi:
            continue
        t = bisect.bisect_right(starts, lo) - 1
        while t < len(stream) and starts[t] < hi:
            a, b = max(lo, starts[t]), min(hi, starts[t + 1])
            if b > a:
                pieces[r].append(Piece(stream[t], a - starts[t], b - a))
            t += 1
    return Plan(world=world, tensors=tensors, replicated=replicated, slices=slices,
                pieces=tuple(tuple(p) for p in pieces),
                slice_reads=tuple(tuple(p) for p in slice_reads),
                scatter_reads=tuple(tuple(s) for s in scatter_reads),
                quotas=tuple(cuts[r + 1] - cuts[r] for r in range(world)))


def plan_broadcasts(pieces: Sequence[Sequence[Piece]],
                    bucket_bytes: int = BUCKET_BYTES) -> List[Broadcast]:
    """The exchange of replicated pieces: owner by owner, in order; a piece of at least half a
    bucket goes straight from and into the tensors' memory, smaller ones are packed into buckets
    of at most `bucket_bytes`."""
    if bucket_bytes < 1:
        raise ValueError(f"ferry.distributed: bucket size must be >= 1, not {bucket_bytes}")
    ops: List[Broadcast] = []
    for src, own in enumerate(pieces):
        bucket: List[Piece] = []
        filled = 0
        for p in own:
            if p.length * 2 >= bucket_bytes:
                if bucket:
                    ops.append(Broadcast(src, tuple(bucket), filled, True))
                    bucket, filled = [], 0
                ops.append(Broadcast(src, (p,), p.length, False))
                continue
            if filled + p.length > bucket_bytes and bucket:
                ops.append(Broadcast(src, tuple(bucket), filled, True))
                bucket, filled = [], 0
            bucket.append(p)
            filled += p.length
        if bucket:
            ops.append(Broadcast(src, tuple(bucket), filled, True))
    return ops


def merge_regions(pieces: Sequence[Piece], offset_of: Callable[[int], int],
                  gap: int) -> List[Tuple[int, int, List[Piece]]]:
    """Pieces laid in one allocation (tensor i at offset_of(i)) merged into (begin, end, pieces)
    regions wherever the next piece starts within `gap` bytes of the previous one's end (the
    padding between tensors): one exchange op per region instead of one per piece."""
    out: List[Tuple[int, int, List[Piece]]] = []
    for p in pieces:
        a = offset_of(p.tensor) + p.begin
        b = a + p.length
        if out and 0 <= a - out[-1][1] <= gap:
            begin, _, members = out[-1]
            members.append(p)
            out[-1] = (begin, b, members)
        else:
            out.append((a, b, [p]))
    return out


__all__ = ["ALIGN", "BUCKET_BYTES", "Broadcast", "Piece", "Plan", "Slice", "TensorSpec",
           "TOLERANCE", "merge_regions", "plan_broadcasts", "plan_load", "resolve_shard_plan",
           "split_points"]
