#!/usr/bin/env python3
"""Small reads from Python (issues 10 and 48): 4 KiB and 64 KiB at random aligned offsets of a
page-cached file, on 1 and N threads that share one ferry File, through File.read and
File.pread().get(), against the same threads calling os.preadv into their own bytearrays; side by
side in one process. Each case is timed by the wall clock over all its threads; the rounds
alternate the three and the best of each is kept. Prints one JSON line per case and a table with
the target (ferry's rate >= 0.7x os.preadv's, issue 48).
Usage: bench/python_small.py [--file PATH] [--rounds N] [--threads 1,8,16] [--reads N]"""

import argparse
import json
import os
import random
import sys
import threading
import time

import ferry

TARGET = 0.7


def timed(threads, body):
    """Runs body(t) on `threads` threads, started together; returns the wall seconds."""
    start = threading.Barrier(threads + 1)
    def run(t):
        start.wait()
        body(t)
    pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    start.wait()
    t0 = time.perf_counter()
    for th in pool:
        th.join()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="/tmp/ferry-python-small.bin")
    ap.add_argument("--file-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", default="1,8,16")
    ap.add_argument("--reads", type=int, default=1 << 15, help="reads per thread per round")
    args = ap.parse_args()
    size = args.file_mib << 20
    with open(args.file, "wb") as out:
        for _ in range(args.file_mib):
            out.write(os.urandom(1 << 20))
    fd = os.open(args.file, os.O_RDONLY)
    while os.read(fd, 1 << 24):  # into the page cache
        pass
    rows = []
    with ferry.open(args.file) as f:
        for io in (4096, 65536):
            for threads in [int(t) for t in args.threads.split(",")]:
                bufs = [bytearray(io) for _ in range(threads)]
                offs = []
                for t in range(threads):
                    rng = random.Random(io * 100 + t)
                    offs.append([rng.randrange(0, size // io) * io for _ in range(args.reads)])

                def raw(t):
                    buf = bufs[t]
                    for o in offs[t]:
                        os.preadv(fd, [buf], o)

                def read(t):
                    buf = bufs[t]
                    for o in offs[t]:
                        f.read(buf, None, o)

                def pread(t):
                    buf = bufs[t]
                    for o in offs[t]:
                        f.pread(buf, None, o).result()

                best = {"preadv": float("inf"), "read": float("inf"), "pread": float("inf")}
                for _ in range(args.rounds):  # interleaved, best of the rounds for each
                    for name, body in (("preadv", raw), ("read", read), ("pread", pread)):
                        best[name] = min(best[name], timed(threads, body))
                reads = threads * args.reads
                rate = {k: reads / s for k, s in best.items()}
                for api in ("read", "pread"):
                    r = {"case": f"python {io >> 10} KiB host, {threads} thread(s), {api}",
                         "io": io, "threads": threads,
                         "preadv_per_s": rate["preadv"], "ferry_per_s": rate[api],
                         "ratio": rate[api] / rate["preadv"],
                         # per read of one thread, as the 1-thread rows of earlier rounds
                         "preadv_us": best["preadv"] / args.reads * 1e6,
                         "ferry_us": best[api] / args.reads * 1e6}
                    print(json.dumps(r), flush=True)
                    rows.append(r)
    os.close(fd)
    os.unlink(args.file)
    print(f"\n{'case (rate, reads/s)':<44} {'preadv':>10} {'ferry':>10} {'ratio':>7}  target",
          file=sys.stderr)
    for r in rows:
        verdict = "PASS" if r["ratio"] >= TARGET else "MISS"
        print(f"{r['case']:<44} {r['preadv_per_s']:>10.0f} {r['ferry_per_s']:>10.0f} "
              f"{r['ratio']:>7.2f}  >= {TARGET:.2f} {verdict}", file=sys.stderr)


if __name__ == "__main__":
    main()
