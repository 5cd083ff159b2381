#!/usr/bin/env python3
"""Where a save's time goes (issue 33): ferry's scattered write of GPU tensors into a new file,
without fsyncs, by how the same bytes are given (one tensor, N tensors, N slices of one tensor,
one buffer's N ranges), each after an untimed sync(2), with the page cache's dirty and writeback
counts around it. `PYTHONPATH=python python3 bench/save_probe.py OUT_DIR [--size GiB]`."""
import argparse
import json
import os
import sys
import time

import torch

import ferry
from ferry.safetensors import torch as ftorch

MIB = 1 << 20


def meminfo() -> dict:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":")
            if k in ("Dirty", "Writeback"):
                out[k] = int(v.split()[0]) // 1024
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--size", type=float, default=4)
    ap.add_argument("--dir", default=os.environ.get("FERRY_BENCH_DIR", "/tmp/ferry-save-probe"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.dir, exist_ok=True)
    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    size = int(a.size * (1 << 30))
    whole = torch.empty(size // 2, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    sep64 = {f"t.{i}": torch.empty(size // 128, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
             for i in range(64)}
    sep8 = {f"t.{i}": torch.empty(size // 16, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
            for i in range(8)}
    if dev != "cpu":
        torch.cuda.synchronize()
    path = os.path.join(a.dir, "probe.bin")
    rows = []

    def case(name, fn, rounds=2):
        for r in range(rounds):
            if os.path.exists(path):
                os.unlink(path)
            os.sync()
            before = meminfo()
            t0 = time.perf_counter()
            report = fn()
            dt = time.perf_counter() - t0
            after = meminfo()
            row = {"case": name, "round": r, "seconds": round(dt, 4),
                   "gbps": round(size / dt / 1e9, 3), "dirty_mib_before": before["Dirty"],
                   "dirty_mib_after": after["Dirty"], "writeback_mib_after": after["Writeback"]}
            if report is not None and hasattr(report, "seconds"):
                row["report_seconds"] = round(report.seconds, 4)
            rows.append(row)
            print(json.dumps(row), flush=True)

    def one_buffer():
        with ferry.open(path, "w") as f:
            f.write(whole)

    def one_buffer_64_ranges():
        with ferry.open(path, "w") as f:
            n = size // 64
            f.pwrite_ranges(whole, [(i * n, n, i * n) for i in range(64)]).result()

    def one_buffer_64_ranges_unaligned():
        with ferry.open(path, "w") as f:
            n = size // 64
            f.pwrite_ranges(whole, [(104 + i * n, n, i * n) for i in range(64)]).result()

    def save(d):
        fut = ftorch.save_file(d, path, durable=False, asynchronous=True)
        return fut.result()

    case("File.write, one buffer", one_buffer)
    case("File.pwrite_ranges, one buffer, 64 ranges", one_buffer_64_ranges)
    case("File.pwrite_ranges, one buffer, 64 ranges at file offsets + 104 B",
         one_buffer_64_ranges_unaligned)
    case("save_file, 1 tensor", lambda: save({"whole": whole}))
    case("save_file, 8 tensors", lambda: save(sep8))
    case("save_file, 64 tensors", lambda: save(sep64))
    with open(os.path.join(a.out, "save_probe.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    if os.path.exists(path):
        os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
