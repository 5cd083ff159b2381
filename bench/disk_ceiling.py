#!/usr/bin/env python3
"""The disk's O_DIRECT ceilings with several streams: the figure ferry's durable writes and cold
reads are compared with (issue 51 items 5 and 7). One dd stream of 64 MiB requests is not a
ceiling: ferry's parallel writes passed it by 1.51x on the H100 machine (round57).

For each stream count S, S dd processes at once each write SIZE/S bytes with O_DIRECT into their
own file, every file and the folder fsynced before the clock stops; then S dd processes read the
files back with O_DIRECT (no page cache either way). The best stream count is the ceiling.

  python3 bench/disk_ceiling.py DIR --gib 8 --streams 1,4,8,16 [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from typing import Dict, List

MIB = 1 << 20
BLOCK = 16 * MIB


def fsync_path(path: str) -> None:
    """fsync a file or a folder by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _run_all(cmds: List[List[str]]) -> None:
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in cmds]
    for p, c in zip(procs, cmds):
        _, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(c)} failed: {err.decode(errors='replace').strip()}")


def measure(work: str, size: int, streams: int) -> Dict[str, float]:
    """Write then read SIZE bytes in STREAMS parallel O_DIRECT dd streams; GB/s of each."""
    os.makedirs(work, exist_ok=True)
    blocks = max(1, size // streams // BLOCK)
    total = blocks * BLOCK * streams
    files = [os.path.join(work, f"ceiling.{i}.bin") for i in range(streams)]
    os.sync()
    t0 = time.perf_counter()
    _run_all([["dd", "if=/dev/zero", f"of={f}", f"bs={BLOCK}", f"count={blocks}", "oflag=direct"]
              for f in files])
    for f in files:
        fsync_path(f)
    fsync_path(work)
    write = time.perf_counter() - t0
    t0 = time.perf_counter()
    _run_all([["dd", f"if={f}", "of=/dev/null", f"bs={BLOCK}", "iflag=direct"] for f in files])
    read = time.perf_counter() - t0
    for f in files:
        os.unlink(f)
    return {"streams": streams, "bytes": total, "write_gbps": round(total / write / 1e9, 3),
            "read_gbps": round(total / read / 1e9, 3)}


def ceilings(work: str, size: int, streams: List[int]) -> Dict[str, object]:
    rows = [measure(work, size, s) for s in streams]
    return {"rows": rows, "write_gbps": max(r["write_gbps"] for r in rows),
            "read_gbps": max(r["read_gbps"] for r in rows)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--streams", default="1,4,8,16")
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args()
    got = ceilings(a.dir, int(a.gib * (1 << 30)), [int(s) for s in a.streams.split(",")])
    for r in got["rows"]:
        print(f"{r['streams']:>3} stream(s): write {r['write_gbps']:.2f} GB/s (fsynced), "
              f"read {r['read_gbps']:.2f} GB/s")
    print(f"ceiling: write {got['write_gbps']:.2f} GB/s, read {got['read_gbps']:.2f} GB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(got, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
