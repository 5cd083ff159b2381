"""dcp.save and dcp.async_save side by side on the GPU machine (issue 51 items 5 and 6): stock
FileSystemWriter (thread_count 1 and 8), stock async_save (its default staging, and DefaultStager
with pinned, async staging), ferry's writer synchronous, and ferry's writer with ferry.dcp.Stager.
For each: the call's return time (the training stall), the staging time (until the tensors may
change), the total (until committed), over --saves saves into one folder; then host RSS and
ferry's pinned pool over the saves. The pinned device-to-host bandwidth is measured in the same
run: ferry's staging goal is <= 1.2x bytes / that bandwidth (bench/NOTES.md). The state dict is
the one tests/python/test_dcp_async.py checks (bench/dcp_state.py): bf16 layers of 256 MiB and a
small optimizer state.

  python3 bench/dcp_async_bench.py --gib 8 --dir /data/bench --saves 20 [--modes ferry_async,...]
"""
import argparse
import json
import shutil
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

import ferry.dcp
import dcp_state
from page_cache import drop_pages, resident_fraction, warm_pages

MODES = ["stock_t1", "stock_t8", "stock_async", "stock_async_pinned", "ferry_sync", "ferry_async"]


def one(mode, sd, path, stager):
    t0 = time.perf_counter()
    if mode in ("stock_t1", "stock_t8"):
        w = dcp.FileSystemWriter(path, thread_count=1 if mode == "stock_t1" else 8)
        dcp.save(sd, storage_writer=w)
        t = time.perf_counter() - t0
        return t, t, t
    if mode == "ferry_sync":
        dcp.save(sd, storage_writer=ferry.dcp.FileSystemWriter(path))
        t = time.perf_counter() - t0
        return t, t, t
    writer = (ferry.dcp.FileSystemWriter(path) if mode == "ferry_async"
              else dcp.FileSystemWriter(path))
    out = dcp.async_save(sd, storage_writer=writer, async_stager=stager)
    returned = time.perf_counter() - t0
    if hasattr(out, "staging_completion"):
        out.staging_completion.result()
        staged = time.perf_counter() - t0
        out.upload_completion.result()
    else:
        staged = returned
        out.result()
    return returned, staged, time.perf_counter() - t0


def loads(sd, path, rounds):
    """dcp.load of the folder into a GPU state dict of sd's shapes, through ferry's reader and
    stock's, cold (the files' pages dropped first) and warm; bit-exact against sd."""
    files = [str(f) for f in Path(path).iterdir() if f.is_file()]
    rows = []
    for _ in range(rounds):
        for reader in ("ferry", "stock"):
            for cache in ("cold", "warm"):
                (drop_pages if cache == "cold" else warm_pages)(files)
                resident = resident_fraction(files)
                into = _like(sd)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                r = (ferry.dcp.FileSystemReader(path) if reader == "ferry"
                     else dcp.FileSystemReader(path))
                dcp.load(into, storage_reader=r)
                torch.cuda.synchronize()
                s = time.perf_counter() - t0
                ok = _same(into, sd)
                nbytes = dcp_state.nbytes(sd)
                rows.append({"reader": reader, "cache": cache, "seconds": s, "resident": resident,
                             "gbps": nbytes / s / 1e9, "equal": ok})
                del into
                print(f"  load {reader:>5} {cache}: {s:.3f} s {nbytes / s / 1e9:.2f} GB/s "
                      f"(resident before {resident:.2f}; equal {ok})")
    return rows


def _like(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_like(x)
    if isinstance(x, dict):
        return {k: _like(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_like(v) for v in x]
    return x


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--saves", type=int, default=20)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--ceiling", help="bench/disk_ceiling.py's --json of the same disk: ratios")
    ap.add_argument("--loads", type=int, default=2,
                    help="after ferry_sync: dcp.load into the GPU through ferry's and stock's "
                    "reader, cold (pages dropped) then warm, this many rounds (0: none)")
    args = ap.parse_args()
    sd = dcp_state.state(args.gib * (1 << 30))
    nbytes = dcp_state.nbytes(sd)
    bw = dcp_state.pinned_d2h_bandwidth(min(nbytes, 2 << 30))
    print(f"{nbytes / 2**30:.2f} GiB in GPU memory; pinned D2H {bw / 1e9:.2f} GB/s -> ferry's "
          f"staging goal {1.2 * nbytes / bw:.3f} s; torch {torch.__version__}")
    results = {"bytes": nbytes, "d2h_bytes_per_s": bw, "torch": torch.__version__, "modes": {}}
    for mode in args.modes.split(","):
        path = Path(args.dir) / f"dcp_{mode}"
        shutil.rmtree(path, ignore_errors=True)
        stager = None
        if mode == "stock_async_pinned":
            stager = DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                                  use_async_staging=True,
                                                  use_non_blocking_copy=True))
        elif mode == "ferry_async":
            stager = ferry.dcp.Stager()
        rows, rss_seen = [], []
        try:
            for _ in range(args.saves):
                rows.append(one(mode, sd, path, stager))
                rss_seen.append(dcp_state.rss())
        except Exception as e:  # a stock mode's own failure (H100, torch 2.11: DefaultStager's
            # KeyError: <class 'type'>) is recorded and the other modes still run
            results["modes"][mode] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{mode:>19}: FAILED after {len(rows)} save(s): {type(e).__name__}: {e}")
            shutil.rmtree(path, ignore_errors=True)
            continue
        pool = stager.report() if isinstance(stager, ferry.dcp.Stager) else None
        if stager is not None:
            stager.close()
        best = min(rows, key=lambda r: r[2])
        later = rows[1:] or rows
        r = {"first": rows[0], "best": best,
             "median_return_s": sorted(x[0] for x in later)[len(later) // 2],
             "median_staged_s": sorted(x[1] for x in later)[len(later) // 2],
             "gib_per_s": nbytes / 2**30 / best[2],
             "rss_mib": [x >> 20 for x in rss_seen], "pool": pool}
        results["modes"][mode] = r
        print(f"{mode:>19}: return {r['median_return_s'] * 1e3:8.1f} ms  staged "
              f"{r['median_staged_s']:.3f} s  total {best[2]:.2f} s ({r['gib_per_s']:.2f} GiB/s)"
              f"  first {rows[0][0] * 1e3:.0f} ms  RSS {rss_seen[0] >> 20}->{rss_seen[-1] >> 20}"
              f" MiB" + (f"  pool {pool['pinned_bytes'] >> 20} MiB, {pool['allocations']} "
                         f"allocation(s)" if pool else ""))
        if mode == "ferry_sync" and args.loads:
            results["loads"] = loads(sd, path, args.loads)
        shutil.rmtree(path, ignore_errors=True)
    if args.ceiling:
        ceil = json.loads(Path(args.ceiling).read_text())
        results["ceiling"] = ceil
        print(f"ceiling (bench/disk_ceiling.py): write {ceil['write_gbps']:.2f} GB/s, read "
              f"{ceil['read_gbps']:.2f} GB/s")
        for mode, r in results["modes"].items():
            if "error" in r:
                continue
            print(f"{mode:>19}: best total {nbytes / r['best'][2] / 1e9:.2f} GB/s = "
                  f"{nbytes / r['best'][2] / 1e9 / ceil['write_gbps']:.2f} of the write ceiling; "
                  f"first {nbytes / r['first'][2] / 1e9 / ceil['write_gbps']:.2f}")
        for row in results.get("loads", []):
            print(f"{row['reader']:>6} load {row['cache']:>4}: {row['gbps']:.2f} GB/s = "
                  f"{row['gbps'] / ceil['read_gbps']:.2f} of the read ceiling")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
