#!/usr/bin/env python3
"""What a user gets: every case in a fresh process with the default settings, the first request
reported apart from the warm rate of the same process, beside the machine's ceilings measured in
the same run. Issue 9's targets are checked at the end.

Usage (on the GPU machine, as scripts/gpu-verify runs it):
  first_request.py --ferry build/tools/ferry --probe build/bench/ferry_startup_probe \
      --file /path/big.bin [--size 8GiB] [--udev-entry /run/udev/data/bMAJ:MIN] [--out r.jsonl]
Prints one JSON object per process to --out and a table to stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

PY_CASE = textwrap.dedent("""
    import json, os, sys, time
    import ferry
    try:
        import cupy as xp
        sync = lambda: xp.cuda.runtime.deviceSynchronize()
    except ImportError:
        import torch
        xp = None
        sync = torch.cuda.synchronize
    path, n = sys.argv[1], os.path.getsize(sys.argv[1])
    a = xp.empty(n, dtype=xp.uint8) if xp is not None else torch.empty(n, dtype=torch.uint8, device="cuda")
    sync()  # the CUDA context exists, as it does in any program that holds GPU arrays
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        ferry.read_into(path, a)
        sync()
        runs.append(n / (time.perf_counter() - t0) / 1e9)
    print(json.dumps({"runs": runs, "verdict": ferry.last_route().verdict}))
""")


def run_json(cmd: list[str], env: dict | None = None) -> dict:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-400:]}
    return json.loads(p.stdout)


def cli_read(ferry: str, path: str, memory: list[str]) -> dict:
    j = run_json([ferry, "read", path, *memory, "--repeat", "3", "--json"])
    if "error" in j:
        return j
    runs = [r["gbps"] for r in j["runs"]]
    return {"first": runs[0], "warm": max(runs[1:]), "verdict": j["route"]["verdict"],
            "workers": j["route"].get("workers")}


def py_read(path: str) -> dict:
    j = run_json([sys.executable, "-c", PY_CASE, path])
    if "error" in j:
        return j
    return {"first": j["runs"][0], "warm": max(j["runs"][1:]), "verdict": j["verdict"]}


def demo(ferry: str) -> dict:
    j = run_json([ferry, "demo", "--json"])
    if "error" in j:
        return j
    return {"first": j["gbps"], "warm": None, "verdict": j["route"]["verdict"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--probe", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--size", default="8GiB")
    ap.add_argument("--udev-entry", default="")
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--out", default="first_request.jsonl")
    a = ap.parse_args()

    if not os.path.exists(a.file):
        subprocess.run([a.ferry, "write", a.file, "--host", "--size", a.size, "--no-sync"],
                       check=True, capture_output=True)
    subprocess.run(["cat", a.file], stdout=subprocess.DEVNULL, check=True)  # into the page cache

    results = []
    out = open(a.out, "w")

    def record(case: str, udev: str, r: dict) -> None:
        r = {"case": case, "udev": udev, **r}
        results.append(r)
        out.write(json.dumps(r) + "\n")
        out.flush()
        if "error" in r:
            print(f"{case:<28} {udev:<9} ERROR {r['error']}")
        else:
            warm = f"{r['warm']:6.1f}" if r.get("warm") else "     -"
            print(f"{case:<28} {udev:<9} first {r['first']:6.1f}  warm {warm}  {r['verdict'][:90]}")

    ceil = {}
    p = subprocess.run([a.probe, "--ceilings", a.file], capture_output=True, text=True)
    for line in p.stdout.splitlines():
        j = json.loads(line)
        ceil[j["case"]] = j["gbps"]
        out.write(line + "\n")
    print(f"ceilings: pinned host-to-device {ceil.get('ceiling_pinned_htod', 0):.1f} GB/s, "
          f"page cache -> host memory (16 threads) {ceil.get('ceiling_page_cache_to_host_16t', 0):.1f} GB/s")

    udev_states = ["absent"] + (["present"] if a.udev_entry else [])
    for udev in udev_states:
        if a.udev_entry:
            if udev == "present":
                os.makedirs(os.path.dirname(a.udev_entry), exist_ok=True)
                with open(a.udev_entry, "w") as f:
                    f.write("E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n")
            elif os.path.exists(a.udev_entry):
                os.remove(a.udev_entry)
        for _ in range(a.processes):
            record("cli gpu (default)", udev, cli_read(a.ferry, a.file, ["--gpu", "0"]))
        for _ in range(a.processes):
            record("python read_into (default)", udev, py_read(a.file))
        for _ in range(2):
            record("ferry demo (1 GiB)", udev, demo(a.ferry))
    for _ in range(2):
        record("cli host (default)", "-", cli_read(a.ferry, a.file, ["--host"]))
        record("cli pinned (default)", "-", cli_read(a.ferry, a.file, ["--pinned"]))

    # Issue 9's targets, on the worst process of each case.
    def worst(case: str, key: str, udev: str | None = None) -> float:
        vals = [r[key] for r in results if r["case"] == case and "error" not in r and
                (udev is None or r["udev"] == udev) and r.get(key)]
        return min(vals) if vals else 0.0

    checks = []
    for udev in udev_states:
        gpu = [r for r in results if r["case"] == "cli gpu (default)" and r["udev"] == udev and "error" not in r]
        ratio = min((r["first"] / r["warm"] for r in gpu), default=0.0)
        checks.append((f"cli gpu first/warm, udev {udev}", ratio, 0.85))
        checks.append((f"ferry demo GB/s, udev {udev}", worst("ferry demo (1 GiB)", "first", udev), 15.0))
        checks.append((f"python first read_into GB/s, udev {udev}",
                       worst("python read_into (default)", "first", udev), 40.0))
    pc = ceil.get("ceiling_page_cache_to_host_16t", 0.0)
    for case in ("cli host (default)", "cli pinned (default)"):
        checks.append((f"{case} warm / page-cache ceiling", worst(case, "warm") / pc if pc else 0.0, 0.85))
    print("\ntargets (worst process):")
    ok = True
    for name, value, target in checks:
        passed = value >= target
        ok &= passed
        print(f"  {'PASS' if passed else 'MISS'} {name}: {value:.2f} (target >= {target})")
        out.write(json.dumps({"check": name, "value": value, "target": target, "pass": passed}) + "\n")
    out.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
