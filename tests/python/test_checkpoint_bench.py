"""bench/checkpoint_bench.py's logic at a tiny size on this machine (host memory where there is no
GPU, the bench's plain reader where safetensors is absent): every case runs in its own process,
the cold case finds its pages dropped, and every ferry load is checked equal."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_runs_every_case_and_checks_equality(tmp_path):
    pytest.importorskip("torch")
    # The logic, not the GPU: on a GPU machine a dozen processes each starting CUDA took over a
    # minute (bench/results/2026-12-01-16146b1-h200-lite), so the GPU stays hidden here.
    env = dict(os.environ, FERRY_BENCH_DIR=str(tmp_path / "work"),
               PYTHONPATH=os.path.join(REPO, "python"), CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "checkpoint_bench.py"),
                        str(tmp_path / "out"), "--tiny"], env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = [json.loads(l) for l in open(tmp_path / "out" / "checkpoint_bench.jsonl")]
    info, rows = lines[0]["info"], lines[1:]
    assert info["synthetic"]["tensors"] == 480 and info["synthetic"]["shards"] == 4
    cases = {(r["temperature"], r["case"]) for r in rows}
    assert {("hot", "ferry"), ("hot", "safetensors.load_file"), ("cold", "ferry")} <= cases
    for r in rows:
        assert "error" not in r, r
        assert r["tensors"] == 480 and r["bytes"] == rows[0]["bytes"]
        if r["temperature"] == "hot" and r["case"].startswith("ferry"):
            assert r["check"]["equal"] and r["check"]["checked"] == 480
            assert len(r["routes"]) == 4  # one request per shard
        if r["temperature"] == "cold":
            assert r["resident_before"] < 0.5, r
    assert "GB/s" in open(tmp_path / "out" / "checkpoint_bench.txt").read()
