"""bench/distributed_bench.py's logic at a tiny size on this machine: parts (b) and (c) run as
ranks in fresh processes (gloo and CPU tensors where there is no GPU), every ferry load is
checked equal, and the bytes read from storage are the checkpoint once for ferry.distributed and
once per rank for the loaders that read it all on each rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_runs_replicated_and_sharded_cases(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")
    # The logic, not the GPU: the GPU stays hidden (CUDA starts in every rank otherwise).
    env = dict(os.environ, FERRY_BENCH_DIR=str(tmp_path / "work"),
               PYTHONPATH=os.path.join(REPO, "python"), CUDA_VISIBLE_DEVICES="",
               GLOO_SOCKET_IFNAME="lo")
    p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "distributed_bench.py"),
                        str(tmp_path / "out"), "--tiny", "--no-cold", "--parts", "bc"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(l) for l in open(tmp_path / "out" / "distributed_bench.jsonl")]
    info = rows.pop()["info"]
    assert info["synthetic"]["tensors"] == 480 and info["multicast_off"]["NCCL_NVLS_ENABLE"] == "0"
    total = info["synthetic"]["bytes"]
    by_case = {r["case"]: r for r in rows}
    assert set(by_case) == {"ferry-distributed", "ferry-each", "safetensors-each",
                            "ferry-sharded"}
    for r in rows:
        assert "error" not in r, r
        assert r["world"] == 2
    assert by_case["ferry-distributed"]["ferry_bytes_read"] == total
    assert by_case["ferry-sharded"]["ferry_bytes_read"] == total
    assert by_case["ferry-each"]["ferry_bytes_read"] == 2 * total
    for case in ("ferry-distributed", "ferry-sharded", "ferry-each"):
        for rank in by_case[case]["ranks"]:
            assert rank["check"]["equal"] and rank["check"]["checked"] == 480, (case, rank)
    assert all(x["check"]["sliced"] > 100 for x in by_case["ferry-sharded"]["ranks"])
    text = open(tmp_path / "out" / "distributed_bench.txt").read()
    assert "ferry-distributed" in text and "MISMATCH" not in text
