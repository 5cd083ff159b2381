"""ferry.transformers under the real transformers' tensor parallelism: a tiny Llama (a real
config, tp_plan "auto"), saved with save_pretrained in several shards, loaded with
``from_pretrained(path, tp_plan="auto", device_mesh=...)`` by every rank, stock and through ferry:
each rank's local shard of every parameter must be the same, ferry's report must say it served
per-rank slices, and each rank must read at most 1.1x the bytes of its shards. Two runs: two gloo
ranks on the CPUs (skipped, with transformers' own error, where this transformers cannot shard on
a CPU mesh), and one NCCL rank on cuda:0. Each rank is a process of torch.multiprocessing.spawn.
Skips, with the reason, without transformers (CI has none); run on the GPU machine:

    PYTHONPATH=$PWD/python python3 -m pytest -q -rs -s tests/python/test_transformers_tp.py

(-s shows each rank's load report.)
"""

from __future__ import annotations

import os
import time
import traceback

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import ferry.transformers as ft  # noqa: E402

WORLD_TIMEOUT_S = 100


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny bf16 Llama checkpoint in several shards (untied head, grouped-query attention;
    every size divisible by 2 as transformers' TP plan asks)."""
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    torch.manual_seed(1234)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path, max_shard_size="100KB")  # several shards
    return str(path)


def _local(value):
    return (value.to_local() if hasattr(value, "to_local") else value).detach().cpu().clone()


def _rank(rank, world, backend, path, store, out):
    """One rank: the TP load stock, then through ferry; what each gave, saved to out/rank{r}.pt
    (or the error)."""
    import torch.distributed as dist
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    device = "cuda" if backend == "nccl" else "cpu"
    if device == "cuda":
        torch.cuda.set_device(rank)
    mesh = torch.distributed.init_device_mesh(device, (world,))
    results = {}
    for mode in ("stock", "ferry"):
        kwargs = dict(tp_plan="auto", device_mesh=mesh, dtype=torch.bfloat16)
        try:
            if mode == "ferry":
                with ft.loading():
                    model = transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs)
                report = ft.last_load_report()
                results["report"] = (str(report), report.taken, report.device, report.bytes)
            else:
                model = transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs)
        except Exception:  # noqa: BLE001 - the parent reports it
            results[mode] = {"error": traceback.format_exc()}
            continue
        results[mode] = {k: _local(v) for k, v in model.state_dict().items()}
        del model
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _run(world, backend, path, tmp_path):
    import torch.multiprocessing as mp
    ctx = mp.spawn(_rank, args=(world, backend, path, str(tmp_path / "store"), str(tmp_path)),
                   nprocs=world, join=False)
    deadline = time.monotonic() + WORLD_TIMEOUT_S
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):  # True once all ended
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{world} {backend} ranks did not finish in {WORLD_TIMEOUT_S} s")
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    for r, got in enumerate(results):
        if "error" in got["stock"]:
            pytest.skip(f"stock transformers {transformers.__version__} cannot load this on "
                        f"{backend} (rank {r}):\n{got['stock']['error'][-1500:]}")
    for r, got in enumerate(results):
        assert "error" not in got["ferry"], f"rank {r} through ferry:\n{got['ferry']['error']}"
        text, taken, device, nbytes = got["report"]
        print(f"rank {r}:\n{text}")
        assert taken == "ferry" and device == f"{ft.SLICES}, rank {r} of {world}", text
        stock, served = got["stock"], got["ferry"]
        assert list(served) == list(stock)
        for name in stock:
            assert served[name].dtype == stock[name].dtype, (r, name)
            assert served[name].shape == stock[name].shape, (r, name)
            assert torch.equal(served[name], stock[name]), (r, name)
        share = sum(t.numel() * t.element_size() for t in stock.values())
        assert nbytes <= 1.1 * share, (r, nbytes, share, text)
    if world > 1:  # the shards are cut: some rank's part differs from another's
        assert any(not torch.equal(results[0]["stock"][k], results[1]["stock"][k])
                   for k in results[0]["stock"])


def test_two_gloo_ranks_on_cpu_load_stock_shards_through_ferry(llama, tmp_path, monkeypatch):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip(f"torch {torch.__version__} has no gloo backend")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the ranks see no GPU: transformers meshes CPUs
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    _run(2, "gloo", llama, tmp_path)


@pytest.mark.gpu
def test_one_nccl_rank_on_cuda0_loads_stock_shards_through_ferry(llama, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    import torch.distributed as dist
    if not dist.is_nccl_available():
        pytest.skip(f"torch {torch.__version__} has no NCCL backend")
    _run(1, "nccl", llama, tmp_path)
