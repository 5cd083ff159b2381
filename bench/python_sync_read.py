#!/usr/bin/env python3
"""Synchronous reads from Python, ferry against os.preadv (bench/NOTES.md §19).

Each request size runs in a fresh process, as a user's script would: the first ferry.File.read
of the process is timed alone, then rounds of random reads of a page-cached file alternate
os.preadv, ferry.File.read, ferry.kvikio's CuFile.read, and the asynchronous path followed by a
wait that both took above 64 KiB before commit 1495596 (all with ferry's default settings); the
median of the rounds' mean latencies is reported with the ratio to os.preadv.

Usage: PYTHONPATH=python python3 bench/python_sync_read.py [--file PATH] [--sizes 4096,...]
       [--reads N] [--rounds N] [--json OUT.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, statistics, sys, time
import numpy as np
import ferry, ferry.kvikio as kvikio
path, n, reads, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
buf = np.empty(n, np.uint8)
f = ferry.File(path)
t = time.perf_counter(); f.read(buf, n, 0); first = (time.perf_counter() - t) * 1e6
fd = os.open(path, os.O_RDONLY)
k = kvikio.CuFile(path, "r")
rng = np.random.default_rng(1)
offsets = (rng.integers(0, os.path.getsize(path) // n - 1, reads) * n).tolist()
def mean_us(call):
    t = time.perf_counter()
    for o in offsets:
        call(o)
    return (time.perf_counter() - t) / len(offsets) * 1e6
cases = {"os.preadv": lambda o: os.preadv(fd, [buf], o),
         "ferry.File.read": lambda o: f.read(buf, n, o),
         "ferry.kvikio CuFile.read": lambda o: k.read(buf, n, o),
         # What File.read and CuFile.read did above 64 KiB before 1495596: the asynchronous
         # path, then a wait (a hand-off to a worker and back).
         "File.pread().result()": lambda o: f.pread(buf, n, o).result(),
         "CuFile.pread().get()": lambda o: k.pread(buf, n, o).get()}
got = {name: [] for name in cases}
for _ in range(rounds):
    for name, call in cases.items():
        got[name].append(mean_us(call))
print(json.dumps({"size": n, "first_ferry_read_us": first,
                  "median_us": {name: statistics.median(v) for name, v in got.items()}}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", default="/tmp/ferry-python-sync.bin")
    p.add_argument("--sizes", default="4096,65536,262144,1048576,4194304")
    p.add_argument("--reads", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if not os.path.exists(a.file) or os.path.getsize(a.file) < (256 << 20):
        with open(a.file, "wb") as out:
            for _ in range(64):
                out.write(os.urandom(4 << 20))
    with open(a.file, "rb") as warm:
        while warm.read(16 << 20):
            pass
    rows = []
    for n in (int(s) for s in a.sizes.split(",")):
        out = subprocess.run([sys.executable, "-c", CHILD, a.file, str(n), str(a.reads),
                              str(a.rounds)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    names = ["ferry.File.read", "ferry.kvikio CuFile.read", "File.pread().result()",
             "CuFile.pread().get()"]
    print("median us per read, and the ratio to os.preadv; the first ferry.File.read of each "
          "fresh process apart")
    print(f"{'size':>8} {'first':>8} {'preadv':>8} " + " ".join(f"{n:>26}" for n in names))
    for r in rows:
        m = r["median_us"]
        base = m["os.preadv"]
        cells = " ".join(f"{m[n]:>18.1f} ({m[n] / base:.2f}x)" for n in names)
        print(f"{r['size']:>8} {r['first_ferry_read_us']:>8.1f} {base:>8.1f} {cells}")
    if a.json:
        with open(a.json, "w") as out:
            for r in rows:
                out.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
