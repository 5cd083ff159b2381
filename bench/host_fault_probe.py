"""How much of a read into fresh host memory is page faults, and do huge pages take it away?

A page-cached file of SIZE is read by ferry (default settings) into host memory allocated four
ways, each in a fresh process, rounds alternating:
  numpy      numpy.empty (glibc malloc: an mmap of 4 KiB pages, as ferry's host tensors are)
  mmap       an anonymous mmap, untouched
  mmap+thp   the same after madvise(MADV_HUGEPAGE)
  touched    numpy.empty written once before the clock: the copy alone, no faults
Prints one JSON line per process, then the medians, and the machine's THP settings.

    python bench/host_fault_probe.py FILE [--size 4GiB] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import mmap, sys, time
import numpy as np
import ferry
path, size, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
f = ferry.File(path)
t0 = time.perf_counter()
if how == "numpy":
    buf = np.empty(size, np.uint8)
elif how == "touched":
    buf = np.empty(size, np.uint8)
    buf.fill(1)
else:
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if how == "mmap+thp":
        m.madvise(mmap.MADV_HUGEPAGE)
    buf = np.frombuffer(m, np.uint8)
t1 = time.perf_counter()
n = f.pread(buf, size, 0).result()
t2 = time.perf_counter()
assert n == size
print(f'{{"how": "{how}", "gbps": {size / (t2 - t1) / 1e9:.3f}, "alloc_s": {t1 - t0:.4f}}}')
"""


def parse_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[:-len(u)]) * m)
    return int(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--size", default="4GiB")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    size = min(parse_size(a.size), os.path.getsize(a.file))
    for knob in ("enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{knob}") as f:
                print(f"transparent_hugepage/{knob}: {f.read().strip()}")
        except OSError as e:
            print(f"transparent_hugepage/{knob}: {e}")
    hows = ["numpy", "mmap", "mmap+thp", "touched"]
    rows = []
    for r in range(a.rounds):
        for how in hows if r % 2 == 0 else hows[::-1]:
            out = subprocess.run([sys.executable, "-c", CHILD, a.file, str(size), how],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                print(json.dumps({"how": how, "error": out.stderr.strip()[-300:]}))
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    for how in hows:
        v = [r["gbps"] for r in rows if r["how"] == how]
        if v:
            print(f"{how:9s} median {statistics.median(v):6.2f} GB/s ({min(v):.2f} .. {max(v):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
