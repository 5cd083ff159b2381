"""bench/host_map_bench.py at a tiny size: every case, ferry's and the raw ones without ferry,
runs in its own process on the cold file and prints its line, and ferry's default maps and
populates the cold file (the route the bench is there to measure, bench/NOTES.md §31). Each
ferry case runs once untimed first, so that no timed case pays for the run's first reads of
torch's and ferry's code (§47), and the summary counts the timed rounds only."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_case_runs_on_the_cold_file_and_auto_populates(tmp_path):
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "host_map_bench.py"),
                        str(tmp_path), "--size-mib", "4", "--rounds", "1", "--states", "cold"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert not [r for r in rows if "error" in r], rows
    warm = [r for r in rows if r["round"] == "warm-up"]
    assert {r["case"] for r in warm} >= {"ferry auto", "ferry map", "ferry read"}, warm
    assert len(warm) == len({r["case"] for r in warm}), warm
    assert all(r["state"] == "resident" for r in warm), warm
    assert rows.index(warm[-1]) < min(rows.index(r) for r in rows if r["round"] != "warm-up")
    cases = {r["case"]: r for r in rows if r["round"] != "warm-up"}
    assert len(cases) == len(rows) - len(warm)  # one timed round: one row per case
    for case in ["ferry auto", "ferry map", "ferry read", "raw direct", "raw direct fresh",
                 "raw populate", "raw mmap touch", "raw buffered"]:
        assert case in cases, sorted(cases)
        assert any(line.startswith(f"cold      {case} ") and ", n=1" in line
                   for line in p.stdout.splitlines()), case
    if cases["ferry auto"]["resident_before"] >= 0.9:
        pytest.skip("this file system keeps the pages (tmpfs?)")
    assert cases["ferry auto"]["route"] == "populated", cases["ferry auto"]
    assert cases["ferry map"]["route"] == "mapped" and cases["ferry read"]["route"] == "read"
    assert len({cases[c]["checksum"] for c in ["ferry auto", "ferry map", "ferry read"]}) == 1
    assert {cases[c]["bytes"] for c in cases if c.startswith("raw")} == {
        os.path.getsize(tmp_path / "model.safetensors")}
