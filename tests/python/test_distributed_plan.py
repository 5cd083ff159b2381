"""ferry.distributed's planning, a pure function of the tensors and the number of ranks, for 1 to
64 ranks: every byte read from storage exactly once, each rank's share balanced and contiguous,
tensors split only where that balances better, cuts aligned, slices as torch.tensor_split
(numpy.array_split) makes them and byte ranges equal to NumPy's slices, and the exchange ops
covering every piece once. No torch, no GPU."""

from __future__ import annotations

import random

import numpy as np
import pytest

from ferry.distributed import (TensorSpec, merge_regions, plan_broadcasts, plan_load,
                               resolve_shard_plan, split_points, split_range)
from ferry.distributed._plan import ALIGN, TOLERANCE

WORLDS = list(range(1, 17)) + [24, 31, 32, 48, 63, 64]
ITEM = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1}


def spec(name, dtype, shape):
    n = ITEM[dtype]
    for d in shape:
        n *= d
    return TensorSpec(name, dtype, tuple(shape), n)


def llm_like(seed, layers=6):
    """A checkpoint shaped like a small transformer: embeddings, per-layer projections and
    norms (tiny), a head; sizes from a few bytes to tens of MiB."""
    rng = random.Random(seed)
    hidden = rng.choice([256, 512, 1024, 2048])
    vocab = rng.choice([1000, 32000, 50257])
    out = [spec("embed.weight", "BF16", (vocab, hidden))]
    for i in range(layers):
        out += [spec(f"l{i}.q.weight", "BF16", (hidden, hidden)),
                spec(f"l{i}.k.weight", "BF16", (hidden // 4, hidden)),
                spec(f"l{i}.o.weight", "BF16", (hidden, hidden)),
                spec(f"l{i}.norm.weight", "F32", (hidden,)),
                spec(f"l{i}.up.weight", "BF16", (4 * hidden, hidden)),
                spec(f"l{i}.down.weight", "BF16", (hidden, 4 * hidden))]
    out += [spec("norm.weight", "F32", (hidden,)), spec("step", "I64", ()),
            spec("empty", "F16", (0, 3)), spec("lm_head.weight", "BF16", (vocab, hidden))]
    return out


def random_tensors(seed, n=40):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.1:
            shape = ()
        elif kind < 0.15:
            shape = (0, rng.randint(1, 9))
        elif kind < 0.6:
            shape = (rng.randint(1, 300),)
        elif kind < 0.95:
            shape = (rng.randint(1, 700), rng.randint(1, 600))
        else:
            shape = (rng.randint(1000, 5000), rng.randint(500, 3000))
        out.append(spec(f"t{i}", rng.choice(list(ITEM)), shape))
    return out


def check_plan(tensors, world, shard=None, tolerance=TOLERANCE, align=ALIGN):
    plan = plan_load(tensors, world, shard, tolerance=tolerance, align=align)
    total = sum(t.nbytes for t in tensors)
    assert plan.total_bytes == total
    # Every rank's storage bytes add up to the checkpoint: each byte read once.
    loads = [plan.storage_bytes(r) for r in range(world)]
    assert sum(loads) == total
    # Replicated tensors: their pieces tile each tensor exactly once.
    covered = {i: [] for i in plan.replicated}
    for r in range(world):
        for p in plan.pieces[r]:
            assert p.length > 0
            covered[p.tensor].append((p.begin, p.end, r))
    for i, ranges in covered.items():
        ranges.sort()
        at = 0
        for a, b, _ in ranges:
            assert a == at, (tensors[i], ranges)
            at = b
        assert at == tensors[i].nbytes
    # Each rank's share is one contiguous run of the replicated stream, ranks in order.
    stream = [i for i in plan.replicated if tensors[i].nbytes]
    start = {}
    acc = 0
    for i in stream:
        start[i] = acc
        acc += tensors[i].nbytes
    at = 0
    for r in range(world):
        for p in plan.pieces[r]:
            assert start[p.tensor] + p.begin == at
            at = start[p.tensor] + p.end
        assert plan.quotas[r] == sum(p.length for p in plan.pieces[r])
    assert at == acc
    # Cuts inside a tensor fall on `align` boundaries.
    for r in range(world):
        for p in plan.pieces[r]:
            assert p.begin % align == 0 or p.begin == 0
            assert p.end % align == 0 or p.end == tensors[p.tensor].nbytes
    # Balance: water-filled to one level, each cut at most max(tolerance, align) from ideal.
    fixed = [sum(p.length for p in plan.slice_reads[r]) +
             sum(tensors[i].nbytes for i in plan.scatter_reads[r]) for r in range(world)]
    slack = 2 * max(int(total / world * tolerance), align) + 2
    level = max(total / world, max(fixed))
    for r in range(world):
        assert loads[r] <= level + slack, (r, loads, fixed)
    if not shard:
        for r in range(world):
            assert abs(loads[r] - total / world) <= slack, (r, loads)
    return plan


@pytest.mark.parametrize("world", WORLDS)
def test_replicated_plans_read_every_byte_once_balanced(world):
    for seed in range(4):
        check_plan(llm_like(seed), world)
        check_plan(random_tensors(seed), world)
    check_plan(random_tensors(7), world, align=1)


@pytest.mark.parametrize("world", [1, 2, 3, 8, 64])
def test_edges_and_degenerate_checkpoints(world):
    check_plan([], world)
    check_plan([spec("s", "F32", ())], world)
    check_plan([spec("e", "F16", (0, 4)), spec("e2", "F32", (4, 0))], world)
    # One huge tensor: split into `world` nearly equal aligned pieces.
    big = [spec("w", "U8", (world * 10 << 20,))]
    plan = check_plan(big, world)
    assert [len(p) for p in plan.pieces] == [1] * world
    assert all(abs(p[0].length - (10 << 20)) <= ALIGN for p in plan.pieces)


def test_small_tensors_are_never_split_when_an_edge_is_near():
    # 1000 tensors of 40 KiB on 8 ranks: an edge is always within 40 KiB of a cut, well inside
    # the tolerance (1/64 of a 5 MB share), so every tensor stays whole.
    tensors = [spec(f"t{i}", "U8", (40 << 10,)) for i in range(1000)]
    plan = check_plan(tensors, 8)
    for r in range(8):
        for p in plan.pieces[r]:
            assert p.begin == 0 and p.length == tensors[p.tensor].nbytes
    assert sorted(len(p) for p in plan.pieces)[-1] - sorted(len(p) for p in plan.pieces)[0] <= 1


def test_big_tensors_are_split_where_that_balances_better():
    # Three tensors of 96 MiB on 2 ranks: whole tensors would give 192/96 MiB; the middle one is
    # split at 48 MiB instead, and each rank reads 144 MiB.
    tensors = [spec(f"t{i}", "U8", (96 << 20,)) for i in range(3)]
    plan = check_plan(tensors, 2)
    assert [plan.storage_bytes(r) for r in range(2)] == [144 << 20, 144 << 20]
    assert plan.pieces[0][-1] == plan.pieces[0][-1].__class__(1, 0, 48 << 20)


@pytest.mark.parametrize("world", WORLDS)
def test_split_points_are_array_splits(world):
    for size in list(range(0, 70)) + [1000, 4097]:
        starts = split_points(size, world)
        sizes = [len(a) for a in np.array_split(np.arange(size), world)]
        assert [starts[r + 1] - starts[r] for r in range(world)] == sizes
        assert starts[0] == 0 and starts[-1] == size


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 7, 8, 16, 33, 64])
def test_sharded_plans_slice_like_numpy(world):
    rng = np.random.default_rng(world)
    tensors = [spec("a", "F32", (37, 5)), spec("b", "BF16", (6, 91)), spec("c", "F16", (1, 1, 40, 3)),
               spec("d", "I64", (2, 3, 4)), spec("e", "U8", (130,)), spec("f", "F32", (3, 0, 2)),
               spec("rep", "F32", (300, 7)), spec("s", "F32", ())]
    dims = {"a": 0, "b": 1, "c": 2, "d": -1, "e": 0, "f": 2}
    plan = check_plan(tensors, world, dims)
    assert plan.replicated == (6, 7)
    for i, t in enumerate(tensors):
        if t.name not in dims:
            continue
        s = plan.slices[i]
        assert s.dim == dims[t.name] % len(t.shape)
        whole = rng.integers(0, 256, t.nbytes, dtype=np.uint8)
        items = whole.reshape(t.shape + (t.nbytes // max(t.numel, 1) if t.numel else ITEM[t.dtype],))
        parts = np.array_split(items, world, axis=s.dim)
        # contiguous exactly when every dimension before the split one is 1
        assert s.contiguous == all(d == 1 for d in t.shape[:s.dim])
        for r in range(world):
            expect = np.ascontiguousarray(parts[r]).tobytes()
            assert s.shape(t, r) == parts[r].shape[:-1]
            assert s.nbytes(t, r) == len(expect)
            if s.contiguous:
                begin, length = s.byte_range(t, r)
                assert whole[begin:begin + length].tobytes() == expect
                mine = [p for p in plan.slice_reads[r] if p.tensor == i]
                assert (mine[0].begin, mine[0].length) == (begin, length) if length else not mine
            else:
                assert 0 <= s.reader < world
        if not s.contiguous:
            readers = [r for r in range(world) if i in plan.scatter_reads[r]]
            assert readers == [s.reader]


@pytest.mark.parametrize("world", [2, 3, 8, 64])
def test_scattered_tensors_spread_over_readers_and_replicas_fill_around_them(world):
    # Half the tensors sharded along dimension 1 (each read whole by one rank), the rest
    # replicated: readers are spread, and the replicated bytes water-fill around them.
    tensors = llm_like(3, layers=8)
    names = [t.name for t in tensors if len(t.shape) == 2][::2]
    plan = check_plan(tensors, world, {n: 1 for n in names})
    readers = {plan.slices[i].reader for i in plan.slices if not plan.slices[i].contiguous}
    assert len(readers) == min(world, len(names))


def test_shard_plan_callable_and_errors():
    tensors = [spec("w", "F32", (4, 6)), spec("b", "F32", (4,)), spec("s", "F32", ()),
               TensorSpec("p", "F4", (8,), 4)]
    assert resolve_shard_plan(tensors, lambda name, shape: 0 if len(shape) == 2 else None) == {0: 0}
    assert resolve_shard_plan(tensors, {"w": -1, "b": None}) == {0: 1}
    assert resolve_shard_plan(tensors, None) == {}
    with pytest.raises(ValueError, match="lacks: 'nope'"):
        resolve_shard_plan(tensors, {"nope": 0})
    with pytest.raises(ValueError, match="scalar"):
        resolve_shard_plan(tensors, {"s": 0})
    with pytest.raises(ValueError, match="no dimension 2"):
        resolve_shard_plan(tensors, {"w": 2})
    with pytest.raises(ValueError, match="packed"):
        resolve_shard_plan(tensors, {"p": 0})
    with pytest.raises(ValueError, match="not a dimension"):
        resolve_shard_plan(tensors, {"w": True})
    with pytest.raises(ValueError, match="world size"):
        plan_load(tensors, 0)


@pytest.mark.parametrize("world", [1, 2, 5, 64])
def test_broadcasts_cover_every_piece_once_in_owner_order(world):
    tensors = llm_like(1) + random_tensors(2)
    plan = plan_load(tensors, world)
    for bucket in (1 << 12, 1 << 20, 64 << 20):
        ops = plan_broadcasts(plan.pieces, bucket)
        seen = [p for op in ops for p in op.pieces]
        assert seen == [p for own in plan.pieces for p in own]
        assert [op.src for op in ops] == sorted(op.src for op in ops)
        for op in ops:
            assert op.nbytes == sum(p.length for p in op.pieces)
            assert all(p in plan.pieces[op.src] for p in op.pieces)
            if op.packed:
                assert op.nbytes <= bucket
                assert all(p.length * 2 < bucket for p in op.pieces)
            else:
                assert len(op.pieces) == 1 and op.nbytes * 2 >= bucket
        payload, delivered = plan.exchange_bytes(bucket)
        assert payload == plan.total_bytes
        assert delivered == payload * (world - 1)
    with pytest.raises(ValueError):
        plan_broadcasts(plan.pieces, 0)


def test_merge_regions_joins_pieces_across_padding_only():
    tensors = [spec("a", "U8", (100,)), spec("b", "U8", (256,)), spec("c", "U8", (10,))]
    from ferry.distributed import Piece
    offsets = {0: 0, 1: 256, 2: 1024}  # c is after something else
    pieces = [Piece(0, 0, 100), Piece(1, 0, 256), Piece(2, 0, 10)]
    regions = merge_regions(pieces, offsets.__getitem__, 255)
    assert [(a, b, len(m)) for a, b, m in regions] == [(0, 512, 2), (1024, 1034, 1)]
    assert tensors  # shapes only document the layout


@pytest.mark.parametrize("parts", [1, 2, 3, 8, 64])
def test_split_range_for_several_gpus(parts):
    for offset, size in [(0, 0), (0, 1), (4096, 16 << 20), (123, (8 << 30) + 5)]:
        cut = split_range(offset, size, parts)
        assert len(cut) == parts
        assert cut[0][0] == offset and sum(n for _, n in cut) == size
        for (a, n), (b, _) in zip(cut, cut[1:]):
            assert a + n == b
            assert b % ALIGN == 0 or b in (offset, offset + size)
        if size >= parts * ALIGN * 4:
            assert max(n for _, n in cut) - min(n for _, n in cut) <= 2 * ALIGN


def test_every_cpp_dtype_is_in_every_python_mapping():
    # Issues 32 and 46: the dtypes were tabled in C++ and again in checkpoint.py (NumPy's and
    # torch's names, the kinds dtype= converts), _save.py (the way back), transformers.py (the
    # kinds a cast shrinks) and here (item sizes, 5 dtypes short). Every one now reads the C++
    # table, whose rows come with their framework names.
    import numpy
    import ferry
    from ferry import _save, checkpoint
    from ferry.distributed import _plan
    table = ferry._ferry.safetensors_dtypes()
    assert len(table) == 22  # every Dtype of include/ferry/checkpoint.h
    assert (table["BF16"].bits, table["F8_E4M3FNUZ"].bits, table["C64"].bits) == (16, 8, 64)
    for name, d in table.items():
        assert d.name == name
        assert _plan._itemsize(_plan.TensorSpec("t", name, (0,), 0)) == max(d.bits // 8, 1)
        if d.bits >= 8:  # a load views every whole-byte kind as NumPy's dtype or its raw bits
            assert numpy.dtype(d.numpy or f"uint{d.bits}").itemsize * 8 == d.bits
            assert d.torch, name  # and torch (2.1 on) has a dtype for each
        if d.torch:
            assert _save._TORCH_FORMAT[d.torch] == name
        if d.numpy:
            assert _save._NUMPY_FORMAT[d.numpy] == name
    assert table["F4"].torch == "float4_e2m1fn_x2" and table["BF16"].numpy == ""
    assert checkpoint._PACKED == _plan.PACKED == ("F6_E2M3", "F6_E3M2", "F4")
    # The kinds a load's dtype= converts, which checkpoint.py and transformers.py tabled again.
    assert [n for n, d in table.items() if d.convertible] == [
        "F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0"]
