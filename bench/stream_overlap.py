#!/usr/bin/env python3
"""Compute overlapping stream-ordered reads (issue 16): ferry's ``File.read_async`` against
KvikIO's behaviour for the same call (its compatibility-mode ``read_async`` synchronises the
stream, then reads), in one process, on the same file and GPU.

A loop over `--batches` batches of `--batch` bytes of a page-cached file: each batch is read into
one of two GPU buffers, then a kernel chain reads the batch (a sum over it) and runs matrix
products sized so that one batch's compute takes about as long as its read. Two patterns:

  one stream   read and compute queued on one stream, as KvikIO's examples do:
               ferry    f.read_async(buf, stream); compute(buf) on the stream
               sync     stream.synchronize(); f.read(buf); compute(buf) on the stream
  two streams  reads on one stream, compute on another, events between them, the buffer of
               batch i reused by batch i+2 once its compute is done:
               ferry    read_async on the read stream; the compute stream waits on an event
               sync     synchronise the read stream, read, record the event

`sync` reads with ferry's own parallel engine, so the cases differ in ordering only; KvikIO's
own default (one thread) would be slower still (shared/device.md). Every case runs `--repeat`
times, the cases interleaved; the first run of each and the median are reported, with the
lower bound max(read alone, compute alone) and the serial sum read + compute. The buffers'
contents are checked against the file after the last run of each case.

Usage: stream_overlap.py [--file PATH] [--batch BYTES] [--batches N] [--repeat N] [--json]
                         [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", default="/tmp/ferry-stream-overlap.bin")
    p.add_argument("--batch", type=int, default=64 << 20)
    p.add_argument("--batches", type=int, default=32)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", default=None, help="also write the lines and JSON rows here")
    p.add_argument("--json", action="store_true", help="print one JSON row per case at the end")
    a = p.parse_args()

    import torch

    import ferry

    size = a.batch * a.batches
    if not os.path.exists(a.file) or os.path.getsize(a.file) != size:
        rng = np.random.default_rng(5)
        with open(a.file, "wb") as out:
            for _ in range(a.batches):
                out.write(rng.integers(0, 256, a.batch, dtype=np.uint8).tobytes())
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    dev = torch.device("cuda:0")
    bufs = [torch.empty(a.batch, dtype=torch.uint8, device=dev) for _ in range(2)]
    m = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    acc = torch.zeros(4096, 4096, device=dev, dtype=torch.bfloat16)
    sums = torch.zeros(a.batches, device=dev, dtype=torch.int64)
    f = ferry.open(a.file)

    def compute(i: int, buf: "torch.Tensor", products: int) -> None:
        sums[i] = buf.view(torch.int32).sum(dtype=torch.int64)  # reads the batch
        for _ in range(products):
            torch.mm(m, m, out=acc)

    # Calibration: read alone, compute alone (warm), products per batch to balance them.
    f.read(bufs[0], file_offset=0)
    t = time.perf_counter()
    for i in range(a.batches):
        f.read(bufs[i % 2], file_offset=i * a.batch)
    torch.cuda.synchronize()
    read_s = (time.perf_counter() - t) / a.batches
    compute(0, bufs[0], 4)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        compute(0, bufs[0], 10)
    torch.cuda.synchronize()
    per_product = (time.perf_counter() - t) / 50
    products = max(1, round(read_s / per_product))
    t = time.perf_counter()
    for i in range(a.batches):
        compute(i, bufs[i % 2], products)
    torch.cuda.synchronize()
    compute_s = (time.perf_counter() - t) / a.batches
    say(f"# stream_overlap: {a.batches} batches of {a.batch >> 20} MiB, {torch.cuda.get_device_name(0)}, "
        f"torch {torch.__version__}, ferry {ferry.__version__}")
    say(f"read alone {read_s * 1e3:.2f} ms/batch ({a.batch / read_s / 1e9:.1f} GB/s), compute "
        f"alone {compute_s * 1e3:.2f} ms/batch ({products} bf16 4096^3 products + a sum)")

    def one_stream(ordered: bool) -> float:
        s = torch.cuda.Stream()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        futures = []
        for i in range(a.batches):
            buf = bufs[i % 2]
            if ordered:
                futures.append(f.read_async(buf, stream=s, file_offset=i * a.batch))
            else:
                s.synchronize()
                f.read(buf, file_offset=i * a.batch)
            with torch.cuda.stream(s):
                compute(i, buf, products)
        s.synchronize()
        elapsed = time.perf_counter() - t0
        for fut in futures:
            fut.result()
        return elapsed

    def two_streams(ordered: bool) -> float:
        rs, cs = torch.cuda.Stream(), torch.cuda.Stream()
        read_done = [torch.cuda.Event() for _ in range(2)]
        compute_done = [torch.cuda.Event() for _ in range(2)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        futures = []
        for i in range(a.batches):
            k = i % 2
            if i >= 2:
                rs.wait_event(compute_done[k])  # batch i-2's compute is done with the buffer
            if ordered:
                futures.append(f.read_async(bufs[k], stream=rs, file_offset=i * a.batch))
            else:
                rs.synchronize()
                f.read(bufs[k], file_offset=i * a.batch)
            read_done[k].record(rs)
            cs.wait_event(read_done[k])
            with torch.cuda.stream(cs):
                compute(i, bufs[k], products)
            compute_done[k].record(cs)
        cs.synchronize()
        elapsed = time.perf_counter() - t0
        for fut in futures:
            fut.result()
        return elapsed

    expected = np.array([np.fromfile(a.file, dtype=np.int32, count=a.batch // 4,
                                     offset=i * a.batch).astype(np.int64).sum()
                         for i in range(a.batches)])
    cases = {("one stream", "ferry read_async"): lambda: one_stream(True),
             ("one stream", "sync, then read"): lambda: one_stream(False),
             ("two streams", "ferry read_async"): lambda: two_streams(True),
             ("two streams", "sync, then read"): lambda: two_streams(False)}
    times: dict = {k: [] for k in cases}
    checked: dict = {}
    for r in range(a.repeat):
        order = list(cases) if r % 2 == 0 else list(reversed(list(cases)))
        for k in order:
            sums.zero_()
            times[k].append(cases[k]())
            checked[k] = bool(np.array_equal(sums.cpu().numpy(), expected))
            print(f"run {r}: {k[0]}, {k[1]}: {times[k][-1] * 1e3:.1f} ms", file=sys.stderr,
                  flush=True)
    total = a.batch * a.batches
    bound = max(read_s, compute_s) * a.batches
    serial = (read_s + compute_s) * a.batches
    say(f"bound max(read, compute): {total / bound / 1e9:.1f} GB/s; serial read + compute: "
        f"{total / serial / 1e9:.1f} GB/s")
    say(f"{'pattern':12} {'case':18} {'first GB/s':>10} {'median GB/s':>11} {'x sync':>7} "
        f"{'of bound':>8}  data")
    results = []
    for k in cases:
        first = total / times[k][0] / 1e9
        median = total / statistics.median(times[k]) / 1e9
        base = total / statistics.median(times[(k[0], "sync, then read")]) / 1e9
        results.append({"pattern": k[0], "case": k[1], "first_gbps": first,
                        "median_gbps": median, "x_sync": median / base,
                        "of_bound": median / (total / bound / 1e9),
                        "seconds": times[k], "data_ok": checked[k]})
        say(f"{k[0]:12} {k[1]:18} {first:10.1f} {median:11.1f} {median / base:7.2f} "
            f"{median / (total / bound / 1e9):8.2f}  {'ok' if checked[k] else 'WRONG'}")
    if a.json:
        for row in results:
            print(json.dumps(row), flush=True)
    if a.out:
        with open(a.out, "w") as out:
            out.write("\n".join(lines) + "\n")
            for row in results:
                out.write(json.dumps(row) + "\n")
    return 0 if all(checked.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
