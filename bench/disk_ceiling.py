#!/usr/bin/env python3
"""The disk's O_DIRECT ceilings with several streams: the figure ferry's durable writes and cold
reads are compared with (issue 51 items 5 and 7). One dd stream of 64 MiB requests is not a
ceiling: ferry's parallel writes passed it by 1.51x on the H100 machine (round57).

For each stream count S, S dd processes at once each write SIZE/S bytes with O_DIRECT into their
own file, every file and the folder fsynced before the clock stops; then S dd processes read the
files back with O_DIRECT (no page cache either way). A dd stream keeps one request in flight, so
beside them 16 threads take 4 MiB O_DIRECT preadv/pwritev of the same files from one queue
(the files preallocated, then fsynced with the folder, for writes): on the H100 machine's disk,
dd's streams read at 1.4-1.7 GB/s where 16 such threads read at 2.2 (bench/host_map_bench.py's
"raw direct"). The best of all is the ceiling. Neither uses ferry.

  python3 bench/disk_ceiling.py DIR --gib 8 --streams 1,4,8,16 [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import threading
import time
from typing import Dict, List

MIB = 1 << 20
BLOCK = 16 * MIB
THREADS = 16
CHUNK = 4 * MIB


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


def _threaded(files: List[str], write: bool) -> None:
    """Every CHUNK of `files` read (or written, from a buffer of ones) with O_DIRECT by THREADS
    threads taking (file, offset) jobs in order from one queue."""
    jobs = [(f, at) for f in files for at in range(0, os.path.getsize(f), CHUNK)]
    flags = (os.O_WRONLY if write else os.O_RDONLY) | os.O_DIRECT
    fds = {f: os.open(f, flags) for f in files}
    lock = threading.Lock()
    queue = iter(jobs)
    failed: List[BaseException] = []

    def work() -> None:
        buf = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants
        if write:
            buf.write(b"\x01" * CHUNK)
        try:
            while True:
                with lock:
                    job = next(queue, None)
                if job is None:
                    return
                f, at = job
                n = (os.pwritev if write else os.preadv)(fds[f], [buf], at)
                if n <= 0:
                    raise OSError(f"{'pwritev' if write else 'preadv'} of {f} at {at}: {n}")
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            failed.append(e)
        finally:
            buf.close()

    pool = [threading.Thread(target=work) for _ in range(THREADS)]
    try:
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        for fd in fds.values():
            os.close(fd)
    if failed:
        raise failed[0]


def measure_threads(work: str, size: int) -> Dict[str, float]:
    """Write then read SIZE bytes with THREADS threads of O_DIRECT CHUNK requests over 8 files."""
    os.makedirs(work, exist_ok=True)
    per = max(CHUNK, size // 8 // CHUNK * CHUNK)
    files = [os.path.join(work, f"ceiling.t{i}.bin") for i in range(8)]
    for f in files:
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, per)
        finally:
            os.close(fd)
    os.sync()
    t0 = time.perf_counter()
    _threaded(files, write=True)
    for f in files:
        fsync_path(f)
    fsync_path(work)
    write = time.perf_counter() - t0
    t0 = time.perf_counter()
    _threaded(files, write=False)
    read = time.perf_counter() - t0
    for f in files:
        os.unlink(f)
    total = per * len(files)
    return {"streams": f"{THREADS} threads", "bytes": total,
            "write_gbps": round(total / write / 1e9, 3), "read_gbps": round(total / read / 1e9, 3)}


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
    rows = [measure(work, size, s) for s in streams] + [measure_threads(work, size)]
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
        label = f"{r['streams']:>3} stream(s)" if isinstance(r["streams"], int) else r["streams"]
        print(f"{label}: write {r['write_gbps']:.2f} GB/s (fsynced), "
              f"read {r['read_gbps']:.2f} GB/s")
    print(f"ceiling: write {got['write_gbps']:.2f} GB/s, read {got['read_gbps']:.2f} GB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(got, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
