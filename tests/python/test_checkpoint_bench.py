"""bench/checkpoint_bench.py's logic at a tiny size on this machine (host memory where there is no
GPU, the bench's plain reader where safetensors is absent): every case runs in its own process,
the cold case finds its pages dropped, and every ferry load is checked equal. Where transformers
is installed (the GPU machine) the bench also runs its cases on a tiny Llama checkpoint (21
tensors, not the synthetic one's 480); a stand-in for transformers runs those here too."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAND_INS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stand_ins")


def _run_bench(tmp_path, path_first=()):
    # The logic, not the GPU: on a GPU machine a dozen processes each starting CUDA took over a
    # minute (bench/results/2026-12-01-16146b1-h200-lite), so the GPU stays hidden here.
    env = dict(os.environ, FERRY_BENCH_DIR=str(tmp_path / "work"),
               PYTHONPATH=os.pathsep.join([*path_first, os.path.join(REPO, "python")]),
               CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "checkpoint_bench.py"),
                        str(tmp_path / "out"), "--tiny"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = [json.loads(l) for l in open(tmp_path / "out" / "checkpoint_bench.jsonl")]
    assert "GB/s" in open(tmp_path / "out" / "checkpoint_bench.txt").read()
    return lines[0]["info"], lines[1:]


def _check_rows(info, rows):
    """Each row against its own checkpoint: the synthetic one (480 tensors in 4 shards) and,
    where transformers is present, the Llama one (info["model"])."""
    assert info["synthetic"]["tensors"] == 480 and info["synthetic"]["shards"] == 4
    made = {"synthetic": info["synthetic"]}
    if "skipped" not in info["model"]:
        made["llama"] = info["model"]
    assert {r["checkpoint"] for r in rows} == set(made)
    cases = {(r["temperature"], r["case"]) for r in rows if r["checkpoint"] == "synthetic"}
    assert {("hot", "ferry"), ("hot", "safetensors.load_file"), ("cold", "ferry")} <= cases
    first: dict = {}
    for r in rows:
        assert "error" not in r, r
        ckpt = made[r["checkpoint"]]
        first.setdefault(r["checkpoint"], r)
        assert r["bytes"] == first[r["checkpoint"]]["bytes"], r
        if r["case"] != "from_pretrained":  # a model, not a dict of tensors
            assert r["tensors"] == ckpt["tensors"], r
        if r["temperature"] == "hot" and r["case"].startswith("ferry"):
            assert r["check"]["equal"] and r["check"]["checked"] == ckpt["tensors"], r
            # One request per shard, or, into host memory, every shard resident and mapped.
            mapped = [h for h in r["host_routes"] if h.startswith("mapped: ")]
            assert len(r["routes"] if not mapped else mapped) == ckpt["shards"], r
        if r["temperature"] == "cold":
            assert r["resident_before"] < 0.5, r


def test_bench_runs_every_case_and_checks_equality(tmp_path):
    pytest.importorskip("torch")
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed: the bench runs once, with the stand-in "
                    "(test_bench_with_transformers_checks_each_checkpoint_by_its_own_count), "
                    "whose synthetic cases are these")
    _check_rows(*_run_bench(tmp_path))


def test_bench_with_transformers_checks_each_checkpoint_by_its_own_count(tmp_path):
    """The GPU machine's condition (transformers installed) where it is not: the bench adds its
    Llama checkpoint's cases, whose rows count that checkpoint's tensors."""
    pytest.importorskip("torch")
    if importlib.util.find_spec("transformers") is not None:
        pytest.skip("transformers is installed: test_bench_runs_every_case_and_checks_equality "
                    "runs the bench with it")
    info, rows = _run_bench(tmp_path, [STAND_INS])
    assert info["transformers"].endswith("ferry-stand-in")
    assert info["model"]["tensors"] == 21 and info["model"]["shards"] == 2
    assert {(r["temperature"], r["case"]) for r in rows if r["checkpoint"] == "llama"} == {
        ("hot", "ferry-state_dict"), ("hot", "safetensors.load_file"),
        ("hot", "cpu-then-to"), ("hot", "from_pretrained"),
        ("cold", "ferry-state_dict"), ("cold", "safetensors.load_file")}
    _check_rows(info, rows)
