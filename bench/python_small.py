#!/usr/bin/env python3
"""Small reads from Python (issue 10): ferry's File.read of 4 KiB and 64 KiB at random aligned
offsets of a page-cached file against os.preadv into the same bytearray, side by side in one
process. Prints one JSON line per size and a table with the target (ferry <= 2x os.preadv).
Usage: bench/python_small.py [--file PATH] [--rounds N]"""

import argparse
import json
import os
import random
import sys
import time

import ferry


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="/tmp/ferry-python-small.bin")
    ap.add_argument("--file-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=7)
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
            buf = bytearray(io)
            rng = random.Random(io)
            offs = [rng.randrange(0, size // io) * io for _ in range(1 << 15)]

            def raw():
                t0 = time.perf_counter()
                for o in offs:
                    os.preadv(fd, [buf], o)
                return (time.perf_counter() - t0) / len(offs) * 1e6

            def fer():
                t0 = time.perf_counter()
                for o in offs:
                    f.read(buf, None, o)
                return (time.perf_counter() - t0) / len(offs) * 1e6

            a, b = [], []
            for _ in range(args.rounds):  # interleaved, best of the rounds for each
                a.append(raw())
                b.append(fer())
            r = {"case": f"python {io >> 10} KiB host, 1 thread", "preadv_us": min(a),
                 "ferry_us": min(b), "ratio": min(b) / min(a),
                 "ferry_median_us": sorted(b)[len(b) // 2],
                 "preadv_median_us": sorted(a)[len(a) // 2]}
            print(json.dumps(r))
            rows.append(r)
    os.close(fd)
    os.unlink(args.file)
    print(f"\n{'case':<40} {'preadv us':>10} {'ferry us':>10} {'ratio':>7}  target", file=sys.stderr)
    for r in rows:
        verdict = "PASS" if r["ratio"] <= 2.0 else "MISS"
        print(f"{r['case']:<40} {r['preadv_us']:>10.2f} {r['ferry_us']:>10.2f} {r['ratio']:>7.2f}"
              f"  <= 2.00 {verdict}", file=sys.stderr)


if __name__ == "__main__":
    main()
