#!/usr/bin/env python3
"""ferry.torch.save/load against torch.save + fsync and torch.load, with the disk's ceiling
(issue 51 item 7; bench/NOTES.md §39 has the prediction).

    PYTHONPATH=python python3 bench/torch_save_bench.py OUT_DIR              # the GPU machine
    PYTHONPATH=python python3 bench/torch_save_bench.py OUT_DIR --tiny       # logic check, CPU

A state dict of bf16 tensors in GPU memory (8 GiB in 64 tensors, plus an AdamW-shaped optimizer
state of small `step` tensors; --tiny: 64 MiB on the CPU) is saved and loaded by each case in a
fresh process (`--case`), first call and a warm second call reported apart, each after an untimed
os.sync() so none pays for another's dirty pages:
  save: torch.save + fsync of the file and its folder (what a crash-safe stock save needs),
        ferry.torch.save (durable: the same fsyncs), and the disk's ceilings (bench/disk_ceiling.py:
        the best of 1-16 parallel O_DIRECT dd streams, writes fsynced; saves are compared with
        the write ceiling, loads with the read ceiling);
  load: torch.load(map_location="cuda:0", weights_only=True) and ferry.torch.load into cuda:0,
        each of the file with its pages dropped (posix_fadvise DONTNEED; cold) and then again
        (warm: from the page cache).
Checks: ferry's file loads bit-exact with torch.load(weights_only=True); ferry.torch.load of the
stock file equals torch.load's. Writes OUT_DIR/torch_save_bench.jsonl (one row per case and
call, with ferry's route reports) and prints a table with the ratios to the ceiling and to stock.
Bench files go to FERRY_BENCH_DIR (default build-bench-torch-save/ in the repository).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List

from disk_ceiling import ceilings, fsync_path
from page_cache import drop_pages, warm_pages

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
MIB = 1 << 20


def state(tiny: bool, device: str) -> Dict[str, Any]:
    import torch
    size = 64 * MIB if tiny else 8 * GIB
    n = 64
    g = torch.Generator(device=device).manual_seed(51)
    model = {f"model.layers.{i}.weight": torch.empty(size // n // 2, dtype=torch.bfloat16,
                                                     device=device).uniform_(-1, 1, generator=g)
             for i in range(n)}
    optim = {"state": {i: {"step": torch.tensor(10.0)} for i in range(n)},
             "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.95), "eps": 1e-8,
                               "weight_decay": 0.0, "params": list(range(n))}]}
    return {"model": model, "optimizer": optim, "step": 10}


def nbytes(obj: Any) -> int:
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    return 0


def weights_only() -> bool:
    """torch.load's weights_only=True, except on torch 1.x, whose weights-only unpickler cannot
    read a float (the optimizer's lr): --tiny runs there."""
    import torch
    return not torch.__version__.startswith("1.")


def sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_case(case: str, work: str, tiny: bool) -> List[Dict[str, Any]]:
    """One case in this (fresh) process: two calls, first and warm."""
    import torch
    import ferry.torch as ftorch
    device = "cpu" if tiny or not torch.cuda.is_available() else "cuda:0"
    rows: List[Dict[str, Any]] = []
    path = os.path.join(work, case + ".pt")
    if case.startswith("save"):
        sd = state(tiny, device)
        sync(device)
        size = nbytes(sd)
        for call in ("first", "warm"):
            os.sync()
            t0 = time.perf_counter()
            if case == "save_torch_fsync":
                torch.save(sd, path + ".tmp")
                fsync_path(path + ".tmp")
                os.rename(path + ".tmp", path)
                fsync_path(work)
                routes: List[str] = []
            else:
                report = ftorch.save(sd, path)
                routes = [r.to_text() for r in report.routes]
            seconds = time.perf_counter() - t0
            rows.append({"case": case, "call": call, "bytes": size, "seconds": round(seconds, 5),
                         "gbps": round(size / seconds / 1e9, 3), "routes": routes})
        return rows
    source = os.path.join(work, "save_ferry.pt" if case.endswith("ferry_file") else
                          "save_torch_fsync.pt")
    size = os.path.getsize(source)
    for call in ("cold", "warm"):
        # warm: the file read into the page cache first (ferry's cold reads take O_DIRECT and
        # leave no pages, so a second call is otherwise cold again).
        resident = drop_pages([source]) if call == "cold" else warm_pages([source])
        sync("cuda:0" if torch.cuda.is_available() else "cpu")
        where = "cuda:0" if torch.cuda.is_available() and not tiny else "cpu"
        t0 = time.perf_counter()
        if case.startswith("load_torch"):
            out = torch.load(source, map_location=where, weights_only=weights_only())
            routes = []
        else:
            out = ftorch.load(source, map_location=where)
            routes = [r.to_text() for r in ftorch.last_report().routes]
        sync(where)
        seconds = time.perf_counter() - t0
        rows.append({"case": case, "call": call, "bytes": size, "seconds": round(seconds, 5),
                     "gbps": round(size / seconds / 1e9, 3), "resident_before": round(resident, 3),
                     "routes": routes})
        del out
    return rows


def checks(work: str) -> List[Dict[str, Any]]:
    import torch
    import ferry.torch as ftorch
    a = torch.load(os.path.join(work, "save_ferry.pt"), map_location="cpu",
                   weights_only=weights_only())
    b = torch.load(os.path.join(work, "save_torch_fsync.pt"), map_location="cpu",
                   weights_only=weights_only())
    c = ftorch.load(os.path.join(work, "save_torch_fsync.pt"), map_location="cpu")

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor):
            return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        if isinstance(x, dict):
            return list(x) == list(y) and all(same(x[k], y[k]) for k in x)
        if isinstance(x, (list, tuple)):
            return len(x) == len(y) and all(same(p, q) for p, q in zip(x, y))
        return x == y

    return [{"check": "ferry file == stock file (torch.load)", "ok": same(a, b)},
            {"check": "ferry.torch.load(stock) == torch.load(stock)", "ok": same(c, b)}]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--case", help=argparse.SUPPRESS)  # a child process: one case
    args = p.parse_args()
    work = os.environ.get("FERRY_BENCH_DIR", os.path.join(REPO, "build-bench-torch-save"))
    os.makedirs(work, exist_ok=True)
    if args.case:
        print(json.dumps(run_case(args.case, work, args.tiny)))
        return 0
    os.makedirs(args.out, exist_ok=True)
    rows: List[Dict[str, Any]] = []
    cases = ["save_torch_fsync", "save_ferry", "load_torch", "load_ferry", "load_ferry_file"]
    for case in cases:
        cmd = [sys.executable, os.path.abspath(__file__), args.out, "--case", case]
        if args.tiny:
            cmd.append("--tiny")
        done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        rows += json.loads(done.stdout.strip().splitlines()[-1])
    size = rows[0]["bytes"]
    # The ceiling: the best of 1, 4, 8 and 16 parallel O_DIRECT dd streams (fsynced for writes).
    # FERRY_CEILING_JSON: bench/disk_ceiling.py's result for this disk in this run, if measured.
    given = os.environ.get("FERRY_CEILING_JSON")
    if given:
        with open(given) as f:
            ceil = json.load(f)
    else:
        ceil = ceilings(work, size, [1, 4, 8, 16])
    for kind in ("write", "read"):
        gbps = ceil[f"{kind}_gbps"]
        rows.append({"case": f"dd_direct_{kind}", "call": "-", "bytes": size,
                     "seconds": round(size / gbps / 1e9, 5), "gbps": gbps, "streams": ceil["rows"]})
    rows += checks(work)
    with open(os.path.join(args.out, "torch_save_bench.jsonl"), "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    # The stock case of each kind and call: what ferry's are compared with.
    stock = {(r["case"][:4], r["call"]): r["seconds"] for r in rows
             if r.get("case") in ("save_torch_fsync", "load_torch")}
    # Saves are compared with the write ceiling, loads with the read ceiling.
    dd = {k: size / ceil[f"{k}_gbps"] / 1e9 for k in ("write", "read")}
    print(f"{'case':<20}{'call':<7}{'GB/s':>8}{'of dd':>8}{'x stock':>9}")
    for r in rows:
        if "case" not in r:
            print(f"check: {r['check']}: {'pass' if r['ok'] else 'FAIL'}")
            continue
        base = stock.get((r["case"][:4], r["call"]))
        ratio = f"{base / r['seconds']:.2f}" if base else "-"
        kind = "read" if "load" in r["case"] or r["case"].endswith("read") else "write"
        print(f"{r['case']:<20}{r['call']:<7}{r['gbps']:>8.2f}{dd[kind] / r['seconds']:>8.2f}"
              f"{ratio:>9}")
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
