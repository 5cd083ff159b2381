"""shard= of ferry.iter_weights and ferry.load_checkpoint: each rank's slice equals
torch.tensor_split(full, world, dim)[rank] bit for bit (fused QKV / gate-up tensors: each
sub-block split so, the parts joined), and each rank reads only its slice's bytes (ferry's own
count of bytes read from storage), also from a URL. Expert parallelism: names= picks a rank's
experts. The slices read by gloo ranks (2 and 4 processes) add up to the checkpoint once."""

from __future__ import annotations

import pytest

import ferry
from ferry import Shard
from remote_servers import nginx  # noqa: F401 (a fixture)

torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")
from test_iter_weights import write  # noqa: E402  (this folder is on pytest's path)


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"embed": torch.randn(103, 48, generator=g).to(torch.bfloat16),  # uneven everywhere
            "qkv": torch.randn(96, 70, generator=g),  # fused: q 64, k 16, v 16 rows
            "gate_up": torch.randn(2, 50, 33, generator=g).to(torch.float16),
            "o": torch.randn(70, 77, generator=g),
            "ids": torch.arange(5 * 11 * 7).reshape(5, 11, 7),
            "mask": torch.rand(13, 6, generator=g) > 0.5,
            "bias": torch.randn(77, generator=g)}


def expected(full, rule):
    if rule is None:
        return full
    if rule.blocks is None:
        return torch.tensor_split(full, rule.world, rule.dim)[rule.rank]
    parts = torch.split(full, list(rule.blocks), rule.dim)
    return torch.cat([torch.tensor_split(p, rule.world, rule.dim)[rule.rank] for p in parts],
                     rule.dim)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_every_rank_gets_exactly_tensor_splits_slice(tmp_path, world, dim):
    full = weights()
    path = write(tmp_path / "model.safetensors", full)
    total_read = 0
    for rank in range(world):
        rule = (lambda name, shape: None if name == "bias" and dim == 1
                else Shard(dim, rank, world))
        before = ferry.stats().bytes_read
        it = ferry.iter_weights(path, shard=rule)
        got = dict(it)
        read = ferry.stats().bytes_read - before
        share = 0
        for name, t in full.items():
            want = expected(t, rule(name, tuple(t.shape)))
            assert got[name].shape == want.shape and got[name].dtype == want.dtype, name
            assert torch.equal(got[name], want), (name, rank)
            share += want.numel() * want.element_size()
        assert it.report.bytes_read == share
        assert read <= 1.1 * share + 4096, (read, share)  # 4096: the header, read at open
        total_read += it.report.bytes_read
    whole = sum(t.numel() * t.element_size() for t in full.values())
    replicated = full["bias"].numel() * 4 * (world - 1) if dim == 1 else 0
    assert total_read == whole + replicated


def test_fused_tensors_split_each_sub_block(tmp_path):
    full = weights()
    path = write(tmp_path / "model.safetensors", full)
    for world in (2, 4):
        for rank in range(world):
            rules = {"qkv": Shard(0, rank, world, (64, 16, 16)),
                     "gate_up": Shard(1, rank, world, (25, 25)),
                     "o": Shard(1, rank, world)}
            got = dict(ferry.iter_weights(path, names=list(rules), shard=rules))
            for name, rule in rules.items():
                assert torch.equal(got[name], expected(full[name], rule)), (name, world, rank)


def test_a_dim_0_slice_is_one_range_and_others_one_per_run(tmp_path):
    from ferry._weights import _choose
    from ferry.checkpoint import Checkpoint

    full = weights()
    del full["bias"]
    ckpt = Checkpoint(write(tmp_path / "model.safetensors", full))
    runs = {i.entry.name: i.runs for i in _choose(ckpt, None, Shard(0, 1, 4))}
    assert all(len(r) == 1 for r in runs.values())
    runs = {i.entry.name: i.runs for i in _choose(ckpt, None, Shard(1, 1, 4))}
    assert len(runs["o"]) == 70 and len(runs["gate_up"]) == 2 and len(runs["ids"]) == 5
    runs = {i.entry.name: i.runs for i in _choose(ckpt, ["qkv"], Shard(0, 0, 2, (64, 16, 16)))}
    assert [n for _, n in runs["qkv"]] == [32 * 70 * 4, 8 * 70 * 4, 8 * 70 * 4]


def test_read_into_puts_each_run_at_its_byte_of_one_destination(tmp_path):
    from ferry.checkpoint import Checkpoint

    full = torch.arange(40, dtype=torch.int64).reshape(4, 10)
    ckpt = Checkpoint(write(tmp_path / "model.safetensors", {"t": full}))
    out = torch.zeros(8, dtype=torch.int64)
    raw = out.view(torch.uint8)
    # Columns 3 and 4 of each row: four runs of 16 bytes, one destination object.
    ckpt.read_into([("t", raw, (10 * r + 3) * 8, 16, 16 * r) for r in range(4)])
    assert torch.equal(out.reshape(4, 2), full[:, 3:5])
    with pytest.raises(ValueError, match="needs 16 bytes at byte 56 of its destination"):
        ckpt.read_into([("t", raw, 0, 16, 56)])


def test_load_checkpoint_takes_the_same_shard(tmp_path):
    full = weights()
    path = write(tmp_path / "model.safetensors", full)
    rules = {"o": Shard(1, 1, 3), "embed": Shard(0, 2, 3)}
    got = ferry.load_checkpoint(path, shard=rules, dtype="float32")
    assert set(got) == set(full)
    assert torch.equal(got["o"], expected(full["o"], rules["o"]))
    assert torch.equal(got["embed"], expected(full["embed"], rules["embed"]).float())
    assert torch.equal(got["ids"], full["ids"])
    with pytest.raises(ValueError, match="one_allocation"):
        ferry.load_checkpoint(path, shard=rules, one_allocation=True)


def test_expert_parallel_ranks_pick_their_experts_by_name(tmp_path):
    g = torch.Generator().manual_seed(3)
    full = {f"layers.0.experts.{e}.w{k}": torch.randn(16, 32, generator=g)
            for e in range(8) for k in (1, 2)}
    full["layers.0.router"] = torch.randn(8, 32, generator=g)
    path = write(tmp_path / "model.safetensors", full)
    world = 4
    seen = []
    for rank in range(world):
        def mine(name, rank=rank):
            return ".experts." not in name or int(name.split(".")[3]) % world == rank
        before = ferry.stats().bytes_read
        got = dict(ferry.iter_weights(path, names=mine))
        assert sorted(got) == sorted(n for n in full if mine(n))
        assert all(torch.equal(t, full[n]) for n, t in got.items())
        assert ferry.stats().bytes_read - before <= 4 * 16 * 32 * 4 + 8 * 32 * 4 + 4096
        seen += [n for n in got if ".experts." in n]
    assert sorted(seen) == sorted(n for n in full if ".experts." in n)


def test_a_url_source_reads_only_the_slices(nginx, tmp_path):  # noqa: F811
    full = weights()
    path = write(tmp_path / "model.safetensors", full)
    with open(path, "rb") as f:
        url = nginx.put("shard/model.safetensors", f.read())
    for rank in range(3):
        rule = Shard(0, rank, 3)
        it = ferry.iter_weights(url, shard=rule, memory_budget=4096)
        got = dict(it)
        for name, t in full.items():
            assert torch.equal(got[name], expected(t, rule)), (name, rank)
        assert it.report.bytes_read == sum(expected(t, rule).numel() * t.element_size()
                                           for t in full.values())


@pytest.mark.parametrize("rule, message", [
    (Shard(2, 0, 2), r"'o' has shape \[70, 77\]: no dimension 2"),
    (Shard(0, 2, 2), "rank 2 of world size 2"),
    (Shard(0, 0, 2, (60, 5)), r"sub-blocks \[60, 5\] do not add up to its size 70"),
    ({"missing": Shard(0, 0, 2)}, "lacks: 'missing'"),
    ({"o": 0}, "not a ferry.Shard"),
])
def test_a_bad_rule_names_the_file_and_tensor(tmp_path, rule, message):
    path = write(tmp_path / "model.safetensors", {"o": torch.zeros(70, 77)})
    with pytest.raises((ValueError, TypeError), match=message) as e:
        ferry.iter_weights(path, shard=rule)
    assert "model.safetensors" in str(e.value)


# --------------------------------------------------------------------------------- gloo

WORKER = r'''
import datetime, os, pickle, sys
import torch, torch.distributed as dist
import ferry
from ferry import Shard

out_dir, path = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
results = {}
for dim in (0, 1):
    before = ferry.stats().bytes_read
    it = ferry.iter_weights(path, shard=lambda name, shape: Shard(dim, rank, world))
    got = dict(it)
    dist.barrier()  # the ranks read at once
    results[dim] = {"tensors": got, "read": it.report.bytes_read,
                    "storage": ferry.stats().bytes_read - before}
with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
    pickle.dump(results, f)
dist.destroy_process_group()
'''


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_ranks_read_their_slices_and_the_checkpoint_once(tmp_path, world):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip(f"torch {torch.__version__} has no gloo backend")
    from test_distributed import launch
    full = weights()
    del full["bias"]  # one dimension: every other tensor is cut along dimension 0 and then 1
    path = write(tmp_path / "model.safetensors", full)
    results = launch(tmp_path, world, [path], worker=WORKER)
    whole = sum(t.numel() * t.element_size() for t in full.values())
    for dim in (0, 1):
        for r in range(world):
            got = results[r][dim]["tensors"]
            assert list(got) == list(full)
            for name, t in got.items():
                assert torch.equal(t, torch.tensor_split(full[name], world, dim)[r]), (dim, r, name)
        assert sum(results[r][dim]["read"] for r in range(world)) == whole
        storage = sum(results[r][dim]["storage"] for r in range(world))
        assert whole <= storage <= 1.01 * whole + world * 4096, (storage, whole)
