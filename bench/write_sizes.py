#!/usr/bin/env python3
"""Splits the CPU time of `ferry write` into what a request costs once and what it costs per GiB
(bench/NOTES.md §4): fresh processes of `ferry write PATH --size S --pattern zero --no-sync --json`
to a new file, at several sizes, interleaved, --rounds rounds; then a least-squares line
cpu_seconds = fixed + per_gib * GiB over every process. One JSON line per process on stdout, the
fit on stderr.

    write_sizes.py --ferry build/tools/ferry --file PATH [--sizes 256MiB,1GiB,4GiB] [--rounds 3]
                   [--memory gpu|host]
"""
import argparse
import json
import sys

import write_rounds  # beside this file: one `ferry write` process and its figures

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def to_bytes(given):
    text = given
    for unit, scale in UNITS.items():
        if text.endswith(unit):
            text, factor = text[: -len(unit)], scale
            break
    else:
        factor = 1
    try:
        return int(float(text) * factor)
    except ValueError:
        raise SystemExit(f"write_sizes: --sizes: {given!r} is not a size (bytes, KiB, MiB or GiB)")


def one(ferry, path, size, memory):
    r = write_rounds.one(ferry, path, size, memory, [])
    return {"size": size, "bytes": to_bytes(size), "gbps": r["gbps"],
            "cpu_seconds": r["cpu_seconds_per_gib"] * to_bytes(size) / (1 << 30)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ferry", required=True)
    p.add_argument("--file", required=True)
    p.add_argument("--sizes", default="256MiB,1GiB,4GiB")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--memory", default="gpu", choices=["gpu", "host"])
    a = p.parse_args()
    sizes = a.sizes.split(",")
    if len(set(to_bytes(s) for s in sizes)) < 2:
        raise SystemExit("write_sizes: --sizes needs at least two different sizes to fit a line")
    rows = []
    for rnd in range(1, a.rounds + 1):
        for size in sizes if rnd % 2 else list(reversed(sizes)):
            r = {"memory": a.memory, "round": rnd, **one(a.ferry, a.file, size, a.memory)}
            rows.append(r)
            print(json.dumps(r), flush=True)
    xs = [r["bytes"] / (1 << 30) for r in rows]
    ys = [r["cpu_seconds"] for r in rows]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    per_gib = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    fixed = my - per_gib * mx
    for size in sizes:
        r = [x for x in rows if x["size"] == size]
        print("%s %s: %s" % (a.memory, size, ", ".join(
            "%.2f GB/s, %.3f CPU-s" % (x["gbps"], x["cpu_seconds"]) for x in r)), file=sys.stderr)
    print("%s: cpu_seconds = %.3f + %.3f per GiB (%d processes)" % (a.memory, fixed, per_gib, n),
          file=sys.stderr)


if __name__ == "__main__":
    main()
