#!/usr/bin/env python3
"""Writes of one size to a new file, into the page cache (no fsync), by two builds of ferry in
fresh processes, interleaved round by round (issue 14: "GPU writes at >= 0.95 of today's speed
with <= 0.2 CPU-s/GiB"; bench/NOTES.md section 4). Each process is `ferry write PATH --size N
--pattern zero --no-sync --json` with the default settings, so each figure is what a user gets
from a first request. Cases: old and new for each memory kind, and new1 (the new build with
--threads 1) for GPU memory. One JSON line per process on stdout, then the medians and the new
against old ratios on stderr.

    write_rounds.py --old OLD/ferry --new NEW/ferry --file PATH [--size 4GiB] [--rounds 3]
                    [--memory gpu,host]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def one(binary, path, size, memory, extra):
    where = ["--gpu", "0"] if memory == "gpu" else ["--host"]
    cmd = [binary, "write", path, "--size", size, *where, *extra, "--pattern", "zero",
           "--no-sync", "--json"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    finally:
        if os.path.exists(path):
            os.unlink(path)  # its dirty pages go with it: no run writes back another's
    if done.returncode != 0:
        raise SystemExit(f"write_rounds: {' '.join(cmd)} failed ({done.returncode}): "
                         f"{done.stderr.strip()}")
    d = json.loads(done.stdout)
    route = d["route"]
    reasons = route.get("reasons") or route.get("layer1", {}).get("reasons", [])
    return {"gbps": d["gbps"], "cpu_seconds_per_gib": d["cpu_seconds_per_gib"],
            "workers": route.get("workers"),
            "engine": [r["text"] for r in reasons if r.get("code") == "engine"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True)
    p.add_argument("--new", required=True)
    p.add_argument("--file", required=True)
    p.add_argument("--size", default="4GiB")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--memory", default="gpu,host")
    a = p.parse_args()
    memories = a.memory.split(",")
    cases = []
    for m in memories:
        cases += [("old", m, a.old, []), ("new", m, a.new, [])]
        if m == "gpu":
            cases.append(("new1", m, a.new, ["--threads", "1"]))
    rows = []
    for rnd in range(1, a.rounds + 1):
        order = cases if rnd % 2 else list(reversed(cases))  # who goes first alternates
        for which, m, binary, extra in order:
            r = {"which": which, "memory": m, "round": rnd, **one(binary, a.file, a.size, m, extra)}
            rows.append(r)
            print(json.dumps(r), flush=True)
    for m in memories:
        med = {}
        for which in ("old", "new", "new1"):
            r = [x for x in rows if x["which"] == which and x["memory"] == m]
            if not r:
                continue
            med[which] = (statistics.median(x["gbps"] for x in r),
                          statistics.median(x["cpu_seconds_per_gib"] for x in r))
            print(f"{which} from {m}: median {med[which][0]:.2f} GB/s at {med[which][1]:.3f} "
                  f"CPU-s/GiB ({len(r)} processes, workers {sorted({x['workers'] for x in r})})",
                  file=sys.stderr)
        for which in ("new", "new1"):
            if which in med and "old" in med:
                print(f"{which}/old from {m}: {med[which][0] / med['old'][0]:.3f}x the speed, "
                      f"{med[which][1] / med['old'][1]:.2f}x the CPU per GiB", file=sys.stderr)


if __name__ == "__main__":
    main()
