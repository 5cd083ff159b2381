"""Stock conformance of ferry.dcp (issue 51 items 1 and 4), on torch 2.x with
torch.distributed.checkpoint (the GPU machine's torch 2.11; CI's torch 1.13 lacks it and skips
this file, saying so): ferry's writer's output loads bit-exact with stock dcp.load and its stock
FileSystemReader, ferry's reader loads stock output (tests/data/dcp), an overwrite keeps the old
checkpoint until the commit, a failed save leaves it loadable, a second writer is refused, and two
gloo ranks save one checkpoint. Run: PYTHONPATH=python python3 -m pytest tests/python/test_dcp_stock.py"""
import hashlib
import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
try:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader as StockReader
    from torch.distributed.checkpoint import FileSystemWriter as StockWriter
    from torch.distributed.checkpoint.api import CheckpointException
except Exception as e:  # torch 1.x; torch.distributed._shard on Python 3.11
    pytest.skip(f"needs torch.distributed.checkpoint (torch 2.x); torch {torch.__version__}: {e}",
                allow_module_level=True)

import ferry  # noqa: E402
import ferry.dcp  # noqa: E402
from ferry import _ferry  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "dcp"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _state(seed, device):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 8, generator=g)
    sd = {
        "model": {
            "embed.weight": torch.randn(32, 4, generator=g).to(torch.bfloat16),
            "layers.0.attn.w": torch.randn(8, 6, generator=g).to(torch.float16),
            "layers.0.mlp.w": w,
            "layers.0.mlp.w_t": w.t(),  # a non-contiguous view
            "pos": torch.arange(seed, seed + 10, dtype=torch.int64),
            "empty": torch.zeros(0, 3),
            "scalar": torch.tensor(float(seed)),
        },
        "optim": {
            "state": {0: {"step": torch.tensor(seed * 1.0), "exp_avg": torch.randn(16, 8, generator=g),
                          "exp_avg_sq": torch.rand(16, 8, generator=g)}},
            "param_groups": [{"lr": 1e-3 * seed, "betas": (0.9, 0.95), "params": [0]}],
        },
        "step": seed,
        "note": f"generation {seed}",
    }

    def move(x):
        if isinstance(x, dict):
            return {k: move(v) for k, v in x.items()}
        return x.to(device) if isinstance(x, torch.Tensor) else x
    return move(sd)


def _empty_like(sd):
    """`sd`'s shape with every value wrong: DCP names a load's items by the state dict's structure
    (a list of dicts is flattened to "optim.param_groups.0.lr"), so the structure must be kept
    while each leaf is one the load has to replace."""
    if isinstance(sd, dict):
        return {k: _empty_like(v) for k, v in sd.items()}
    if isinstance(sd, (list, tuple)):
        return type(sd)(_empty_like(v) for v in sd)
    if isinstance(sd, torch.Tensor):
        return torch.full_like(sd.contiguous(), 7).cpu()
    if isinstance(sd, str):
        return "not loaded"
    return type(sd)(-1)


def _assert_equal(got, want, path=""):
    if isinstance(want, dict):
        assert sorted(map(str, got)) == sorted(map(str, want)), path
        for k in want:
            _assert_equal(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert torch.equal(got.cpu(), want.cpu()), path
    else:
        assert got == want, path


def _load(path, like, reader):
    sd = _empty_like(like)
    dcp.load(sd, storage_reader=reader(path), no_dist=True)
    return sd


def _save(sd, writer):
    dcp.save(sd, storage_writer=writer, no_dist=True)


@pytest.mark.parametrize("device", DEVICES)
def test_ferry_output_loads_bit_exact_with_stock_dcp_load(tmp_path, device):
    sd = _state(1, device)
    _save(sd, ferry.dcp.FileSystemWriter(tmp_path))
    for reader in (StockReader, ferry.dcp.FileSystemReader):
        got = _load(tmp_path, sd, reader)
        _assert_equal(got["model"], sd["model"])
        _assert_equal(got["optim"]["state"], sd["optim"]["state"])


def test_ferry_output_opens_for_inference_by_its_flattened_names(tmp_path):
    sd = _state(2, "cpu")
    _save(sd, ferry.dcp.FileSystemWriter(tmp_path))
    tensors = ferry.load_checkpoint(tmp_path, device="cpu")
    assert torch.equal(tensors["model.layers.0.mlp.w_t"], sd["model"]["layers.0.mlp.w_t"])
    assert torch.equal(tensors["optim.state.0.exp_avg"], sd["optim"]["state"][0]["exp_avg"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("folder", ["single", "two_ranks"])
def test_ferry_reader_loads_stock_output_as_stock_reader_does(folder, device):
    expected = json.loads((DATA / "expected.json").read_text())[folder]
    md = StockReader(DATA / folder).read_metadata()
    sd = {k: torch.empty(m.size, dtype=m.properties.dtype, device=device)
          for k, m in md.state_dict_metadata.items() if hasattr(m, "chunks")}
    reader = ferry.dcp.FileSystemReader(DATA / folder)
    dcp.load(sd, storage_reader=reader, no_dist=True)
    for k, t in sd.items():
        flat = t.cpu().contiguous().reshape(-1).view(torch.uint8)
        digest = hashlib.sha256(flat.numpy().tobytes() if t.numel() else b"").hexdigest()
        assert digest == expected[k]["sha256"], k
    # Every tensor came through ferry's reader (two_ranks: each chunk of a sharded tensor is an
    # item of its own), none through stock's torch.load; DCP plans no read of an empty chunk.
    items = sum(1 for m in md.state_dict_metadata.values() if hasattr(m, "chunks")
                for c in m.chunks if all(c.sizes))
    assert reader.last_report.tensors == items
    assert reader.last_report.bytes == sum(t.numel() * t.element_size() for t in sd.values())


def _tensors(sd):
    if isinstance(sd, dict):
        return [t for v in sd.values() for t in _tensors(v)]
    return [sd] if isinstance(sd, torch.Tensor) else []


@pytest.mark.parametrize("device", DEVICES)
def test_ferry_reader_reads_every_tensor_by_ferry_into_the_targets_memory(tmp_path, device):
    sd = _state(4, "cpu")
    _save(sd, StockWriter(tmp_path))
    got = _empty_like(sd)
    for part in (got["model"], got["optim"]["state"][0]):
        for k in part:
            part[k] = part[k].to(device)
    reader = ferry.dcp.FileSystemReader(tmp_path)
    dcp.load(got, storage_reader=reader, no_dist=True)
    _assert_equal(got["model"], sd["model"])
    _assert_equal(got["optim"]["state"], sd["optim"]["state"])
    assert got["note"] == sd["note"] and got["step"] == sd["step"]  # byte items: stock's path
    assert all(t.device.type == device for t in _tensors(got["model"]))
    report = reader.last_report
    assert report.tensors == sum(1 for t in _tensors(sd) if t.numel())  # none for the empty one
    assert report.bytes == sum(t.numel() * t.element_size() for t in _tensors(sd))
    assert report.routes, report.summary()


def test_ferry_reader_casts_into_another_dtype_and_fills_a_non_contiguous_target(tmp_path):
    g = torch.Generator().manual_seed(5)
    sd = {"a": torch.randn(8, 6, generator=g).to(torch.bfloat16), "b": torch.randn(6, 8, generator=g)}
    _save(sd, StockWriter(tmp_path))
    a = torch.zeros(8, 6)  # float32 for a bf16 tensor: cast as stock's copy_ casts
    b = torch.zeros(8, 6).t()  # a transposed view: filled in place
    dcp.load({"a": a, "b": b}, storage_reader=ferry.dcp.FileSystemReader(tmp_path), no_dist=True)
    assert torch.equal(a, sd["a"].float())
    assert torch.equal(b, sd["b"]) and not b.is_contiguous()


@pytest.mark.parametrize("device", DEVICES)
def test_a_save_reports_its_files_bytes_fsyncs_routes_and_commit_point(tmp_path, device):
    seen = []
    writer = ferry.dcp.FileSystemWriter(tmp_path, progress=lambda done, total: seen.append(
        (done, total)))
    _save(_state(6, device), writer)
    r = writer.last_report
    assert r.committed == str(tmp_path / ".metadata")
    distcp = [f for f in r.files if f.endswith(".distcp")]
    assert len(distcp) == 1 and os.path.getsize(distcp[0]) == r.writes[0].bytes
    assert r.fsyncs == 4  # the .distcp file and the folder, .metadata and the folder
    assert r.tensors >= 9 and r.routes, r.summary()
    assert seen and seen[-1][0] == seen[-1][1] == r.writes[0].bytes
    assert "committed by renaming" in r.summary()


def test_an_overwrite_replaces_the_old_files_and_keeps_nothing_else(tmp_path):
    _save(_state(1, "cpu"), StockWriter(tmp_path))  # a stock checkpoint first
    (tmp_path / "config.json").write_text("{}")
    sd = _state(2, "cpu")
    _save(sd, ferry.dcp.FileSystemWriter(tmp_path))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "__0_0.distcp" not in names and "config.json" in names
    assert all(".ferry-" not in n for n in names)
    _assert_equal(_load(tmp_path, sd, StockReader)["model"], sd["model"])


def test_a_save_failing_mid_write_leaves_the_old_checkpoint_loadable(tmp_path):
    old = _state(1, "cpu")
    _save(old, ferry.dcp.FileSystemWriter(tmp_path))
    before = sorted(p.name for p in tmp_path.iterdir())
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    class FailingMidWrite(DefaultSavePlanner):
        def resolve_data(self, item):
            if item.index.fqn == "model.pos":
                raise RuntimeError("injected failure mid-write")
            return super().resolve_data(item)
    # One file per item: the items before model.pos are written when it fails.
    with pytest.raises(CheckpointException, match="injected failure mid-write"):
        dcp.save(_state(2, "cpu"), planner=FailingMidWrite(), no_dist=True,
                 storage_writer=ferry.dcp.FileSystemWriter(tmp_path, single_file_per_rank=False))
    _assert_equal(_load(tmp_path, old, StockReader)["model"], old["model"])
    after = [n for n in sorted(p.name for p in tmp_path.iterdir()) if n in before]
    assert after == before
    _save(_state(3, "cpu"), ferry.dcp.FileSystemWriter(tmp_path))  # and the next save tidies up
    assert sum(n.endswith(".distcp") for n in os.listdir(tmp_path)) == 1


def test_a_second_writer_is_refused_and_the_first_checkpoint_stays(tmp_path):
    sd = _state(1, "cpu")
    _save(sd, ferry.dcp.FileSystemWriter(tmp_path))
    held = _ferry.DcpSaveLock(str(tmp_path))
    with pytest.raises(CheckpointException, match="a second writer is refused"):
        _save(_state(2, "cpu"), ferry.dcp.FileSystemWriter(tmp_path))
    del held
    _assert_equal(_load(tmp_path, sd, StockReader)["model"], sd["model"])


def test_overwrite_false_refuses_an_existing_checkpoint(tmp_path):
    _save(_state(1, "cpu"), ferry.dcp.FileSystemWriter(tmp_path))
    with pytest.raises(CheckpointException, match="overwrite=False"):
        _save(_state(2, "cpu"), ferry.dcp.FileSystemWriter(tmp_path, overwrite=False))


def test_a_hostile_metadata_is_refused_naming_its_class(tmp_path):
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))
    (tmp_path / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(pickle.UnpicklingError, match="system"):
        ferry.dcp.FileSystemReader(tmp_path).read_metadata()


def _rank(rank, path, init):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    sd = {"shared": torch.arange(12.0).reshape(3, 4), f"rank{rank}": torch.full((5,), float(rank)),
          "optim": {"step": rank}}
    dcp.save(sd, storage_writer=ferry.dcp.FileSystemWriter(path))
    dist.destroy_process_group()


def test_two_gloo_ranks_save_one_checkpoint_that_stock_loads(tmp_path):
    import torch.multiprocessing as mp
    path = tmp_path / "ckpt"
    mp.spawn(_rank, args=(str(path), f"file://{tmp_path / 'store'}"), nprocs=2, join=True)
    sd = {"shared": torch.zeros(3, 4), "rank0": torch.zeros(5), "rank1": torch.zeros(5)}
    dcp.load(sd, storage_reader=StockReader(path), no_dist=True)
    assert torch.equal(sd["shared"], torch.arange(12.0).reshape(3, 4))
    assert torch.equal(sd["rank1"], torch.ones(5)) and torch.equal(sd["rank0"], torch.zeros(5))
    assert sorted(p.name.split(".")[0] for p in path.glob("*.distcp")) == ["__0_0", "__1_0"]
