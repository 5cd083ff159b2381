"""ferry from Python against the C++ CLI and the Python peers, in one run on one file.

Cases, each best of --repeat on the same page-cached file:
  cli          `ferry read PATH --gpu 0 --json` (the C++ path, its own process)
  read_into    ferry.read_into(path, cupy array)
  numpy_cupy   cupy.asarray(numpy.fromfile(path))
  torch_gds    torch.cuda.gds.GdsFile(...).load_storage (cuFile; opens with O_DIRECT)
Prints one JSON line per case, then a table of ratios against read_into.
Usage: python3 bench/python_bench.py [--file PATH] [--size 8GiB] [--repeat 3] [--cli PATH]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import ferry


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--file", default="/tmp/ferry-python-bench.bin")
    p.add_argument("--size", default="8GiB")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cli", default=os.environ.get("FERRY_CLI", "ferry"))
    args = p.parse_args()

    import cupy

    size = ferry._ferry.parse_size(args.size)
    subprocess.run([args.cli, "write", args.file, "--host", "--size", str(size), "--no-sync"],
                   check=True, stdout=subprocess.DEVNULL)
    results = {}

    def record(name, seconds, note=""):
        results[name] = size / seconds / 1e9
        print(json.dumps({"case": name, "bytes": size, "seconds": seconds,
                          "gbps": results[name], "note": note}), flush=True)

    a = cupy.empty(size, dtype=cupy.uint8)
    ferry.read_into(args.file, a)  # warm the page cache and ferry's bounce buffers
    cupy.cuda.runtime.deviceSynchronize()

    out = subprocess.run([args.cli, "read", args.file, "--gpu", "0", "--repeat",
                          str(args.repeat), "--json"], check=True, capture_output=True, text=True)
    cli = json.loads(out.stdout)
    record("cli", size / 1e9 / cli["best_gbps"], "best of the CLI's own repeats")

    def read_into():
        ferry.read_into(args.file, a)
        cupy.cuda.runtime.deviceSynchronize()
    record("read_into", best(read_into, args.repeat))
    route = ferry.last_route()
    print(str(route), file=sys.stderr)

    expect = cupy.asnumpy(a[:1 << 20])

    def numpy_cupy():
        cupy.asarray(__import__("numpy").fromfile(args.file, dtype="uint8"))
        cupy.cuda.runtime.deviceSynchronize()
    record("numpy_cupy", best(numpy_cupy, min(args.repeat, 2)))

    try:
        import torch
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        g = torch.cuda.gds.GdsFile(args.file, os.O_RDONLY)

        def gds():
            g.load_storage(t.untyped_storage(), 0)
            torch.cuda.synchronize()
        record("torch_gds", best(gds, 1), "cuFile, O_DIRECT: reads the disk")
        assert (t[:1 << 20].cpu().numpy() == expect).all(), "torch GDS read different bytes"
        del t, g
    except Exception as e:  # noqa: BLE001 - report the peer's failure, keep the others
        print(json.dumps({"case": "torch_gds", "error": f"{type(e).__name__}: {e}"}), flush=True)

    base = results["read_into"]
    print(f"\n{'case':<12} {'GB/s':>8} {'read_into/this':>15}", file=sys.stderr)
    for name, gbps in results.items():
        print(f"{name:<12} {gbps:>8.2f} {base / gbps:>15.2f}", file=sys.stderr)
    print(f"read_into vs CLI: {100 * (base / results['cli'] - 1):+.1f}% (target: within 5%)",
          file=sys.stderr)
    os.unlink(args.file)


if __name__ == "__main__":
    main()
