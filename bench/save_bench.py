#!/usr/bin/env python3
"""Saving checkpoints from GPU memory: ferry against safetensors and `ferry write` (issue 33).

    PYTHONPATH=python python3 bench/save_bench.py OUT_DIR --ferry-cli build/tools/ferry   # H200
    PYTHONPATH=python python3 bench/save_bench.py OUT_DIR --tiny    # logic check on any box

For each size (4 and 16 GiB; --tiny: 64 MiB on the CPU), 64 bf16 tensors in GPU memory, in the
same run and each case after an untimed sync(2), so that none pays for another's dirty pages:
  safetensors.torch.save_file (no fsync, as it does), ferry's durable save_file, the same with
  durable=False, ferry's save_checkpoint (durable, shards of 5 GB), `ferry write --gpu 0 --size S`
  (its JSON "seconds": the write request alone; with its "sync_seconds", the request and the
  fsyncs after it; and the subprocess's wall time, with start-up and the fill), the disk's
  ceilings for a durable write of the size (dd with O_DIRECT; dd through the page cache with
  an fsync at the end), and ferry's
  save_file(asynchronous=True): the time until
  it returns, the time until its future completes, and its file compared byte for byte with the
  synchronous one.
Checks: ferry's bytes equal safetensors' (save and save_file) for a mixed-dtype dict with
metadata; round trips both ways (safetensors.torch.load_file of ferry's files, ferry's load_file
of safetensors' files) for every dtype this torch has, zero-size and scalar tensors; a sharded
save read back through its index the way transformers reads it (weight_map, then each shard with
safetensors) and with ferry.load_checkpoint. Writes OUT_DIR/save_bench.jsonl and prints a table
with the ratios ferry/safetensors and ferry/ferry-write and each check's pass/fail. Bench files
go to FERRY_BENCH_DIR (default build-bench-save/ in the repository, on a real disk) and are
removed as it goes (16 GiB at most on disk at a time, twice for the asynchronous comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
MIB = 1 << 20

import torch  # noqa: E402

import ferry  # noqa: E402
from ferry.safetensors import torch as ftorch  # noqa: E402

try:
    import safetensors.torch as st
except ImportError:  # --tiny on a box without it: the safetensors cases are skipped
    st = None

RESULTS: List[Dict[str, Any]] = []


def emit(out: str, **row: Any) -> None:
    RESULTS.append(row)
    print(json.dumps(row), flush=True)
    with open(os.path.join(out, "save_bench.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def sync_device(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def files_equal(a: str, b: str) -> bool:
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(64 * MIB), fb.read(64 * MIB)
            if x != y:
                return False
            if not x:
                return True


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


def timed(fn: Any) -> float:
    os.sync()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------ speed


def speed(out: str, work: str, size: int, device: str, cli: str) -> None:
    n = 64
    per = size // n // 2  # bf16 elements per tensor
    tensors = {f"model.layers.{i}.weight": torch.empty(per, dtype=torch.bfloat16,
                                                       device=device).uniform_(-1, 1)
               for i in range(n)}
    sync_device(device)
    label = f"{size / GIB:g}GiB" if size >= GIB else f"{size // MIB}MiB"
    times: Dict[str, float] = {}
    path = os.path.join(work, "bench.safetensors")

    if st is not None:
        times["safetensors"] = timed(lambda: st.save_file(tensors, path))
        remove(path)
    times["ferry_save_file"] = timed(lambda: ftorch.save_file(tensors, path))
    keep = path + ".sync"
    os.rename(path, keep)
    times["ferry_save_file_nosync"] = timed(lambda: ftorch.save_file(tensors, path,
                                                                      durable=False))
    remove(path)
    ckdir = os.path.join(work, "ckpt")
    times["ferry_save_checkpoint"] = timed(
        lambda: ferry.save_checkpoint(tensors, ckdir, max_shard_size="5GB"))
    remove(ckdir)

    # Where a save's time goes, without fsyncs: one buffer of the same size written through
    # ferry.open in this process (what `ferry write` does, but from torch's memory), and
    # save_file of that one tensor (a scattered write of one range).
    whole = torch.cat([t.view(-1) for t in tensors.values()])
    sync_device(device)

    def one_buffer() -> None:
        with ferry.open(path + ".one", "w") as f:
            f.write(whole)

    times["ferry_file_write_nosync"] = timed(one_buffer)
    remove(path + ".one")
    times["ferry_save_one_tensor_nosync"] = timed(
        lambda: ftorch.save_file({"whole": whole}, path + ".one", durable=False))
    remove(path + ".one")
    del whole
    if cli:
        gpu = ["--gpu", "0"] if device.startswith("cuda") else ["--host"]
        os.sync()
        t0 = time.perf_counter()
        r = subprocess.run([cli, "write", path + ".write", "--size", str(size), *gpu, "--json"],
                           capture_output=True, text=True, check=True)
        times["ferry_write_wall"] = time.perf_counter() - t0  # + start-up, fill, fsyncs
        report = json.loads(r.stdout)
        times["ferry_write"] = report["seconds"]  # the write request alone
        remove(path + ".write")
        os.sync()
        r = subprocess.run([cli, "write", path + ".write", "--size", str(size), *gpu, "--json",
                            "--no-sync"], capture_output=True, text=True, check=True)
        times["ferry_write_nosync"] = json.loads(r.stdout)["seconds"]
        if "sync_seconds" in report:  # the request, then the fsyncs of the file and its folder
            times["ferry_write_durable"] = report["seconds"] + report["sync_seconds"]
        remove(path + ".write")

    # The disk's own ceilings for a durable write of `size` bytes, in the same run: dd from
    # /dev/zero with O_DIRECT (the disk alone), and through the page cache then fsync (what any
    # buffered writer that syncs at the end can reach).
    blocks = max(1, size // (64 * MIB))
    for case, flags in (("dd_direct", ["oflag=direct"]), ("dd_fsync", ["conv=fsync"])):
        os.sync()
        t0 = time.perf_counter()
        done = subprocess.run(["dd", "if=/dev/zero", f"of={path}.dd", "bs=64M", f"count={blocks}",
                               *flags], capture_output=True, text=True)
        if done.returncode == 0:
            times[case] = (time.perf_counter() - t0) * size / (blocks * 64 * MIB)
        remove(path + ".dd")

    os.sync()
    t0 = time.perf_counter()
    fut = ftorch.save_file(tensors, path, asynchronous=True)
    returned = time.perf_counter() - t0
    save_report = fut.result()
    done = time.perf_counter() - t0
    identical = files_equal(path, keep)
    remove(path)
    remove(keep)
    times["ferry_async_return"] = returned
    times["ferry_async_done"] = done
    for route in save_report.routes:  # the tensors' scattered write(s): what each one took
        emit(out, kind="route", size=label, text=route.to_text())

    for case, seconds in times.items():
        emit(out, kind="speed", size=label, bytes=size, case=case, seconds=round(seconds, 5),
             gbps=round(size / seconds / 1e9, 3) if seconds > 0 else None)
    ratios = {"size": label}
    if "safetensors" in times:
        ratios["ferry_save_file/safetensors"] = times["safetensors"] / times["ferry_save_file"]
        ratios["ferry_save_checkpoint/safetensors"] = (times["safetensors"] /
                                                       times["ferry_save_checkpoint"])
        ratios["ferry_save_file_nosync/safetensors"] = (times["safetensors"] /
                                                        times["ferry_save_file_nosync"])
    if "ferry_write" in times:
        ratios["ferry_save_file/ferry_write"] = times["ferry_write"] / times["ferry_save_file"]
        ratios["ferry_save_file_nosync/ferry_write"] = (times["ferry_write"] /
                                                        times["ferry_save_file_nosync"])
    if "ferry_write_durable" in times:
        ratios["ferry_save_file/ferry_write_durable"] = (times["ferry_write_durable"] /
                                                         times["ferry_save_file"])
    for ceiling in ("dd_direct", "dd_fsync"):
        if ceiling in times:
            ratios[f"ferry_save_file/{ceiling}"] = times[ceiling] / times["ferry_save_file"]
    ratios["async_return/sync"] = returned / times["ferry_save_file"]
    emit(out, kind="ratios", **{k: (round(v, 3) if isinstance(v, float) else v)
                                for k, v in ratios.items()})
    emit(out, kind="check", check=f"async file identical to sync ({label})", passed=identical)
    del tensors
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------- checks


def dtypes() -> List[torch.dtype]:
    names = ["bool", "uint8", "int8", "int16", "uint16", "float16", "bfloat16", "int32",
             "uint32", "float32", "int64", "uint64", "float64", "complex64", "float8_e4m3fn",
             "float8_e5m2", "float8_e8m0fnu", "float8_e4m3fnuz", "float8_e5m2fnuz"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


def sample(dtype: torch.dtype, shape: Any, seed: int, device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    count = 1
    for d in shape:
        count *= d
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.randint(0, 256, (count * size,), dtype=torch.uint8, generator=g)
    t = (raw % 2).bool() if dtype == torch.bool else raw.view(dtype)
    return t.reshape(shape).to(device)


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t.reshape(-1)


def equal_dicts(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> List[str]:
    bad = [k for k in a if k not in b or a[k].dtype != b[k].dtype or
           tuple(a[k].shape) != tuple(b[k].shape) or not torch.equal(bits(a[k]), bits(b[k]))]
    return bad + [k for k in b if k not in a]


def mixed(device: str) -> Dict[str, torch.Tensor]:
    d: Dict[str, torch.Tensor] = {}
    for i, dtype in enumerate(dtypes()):
        d[f"t.{i}.{str(dtype).split('.')[-1]}"] = sample(dtype, (5, 3), i, device)
        d[f"s.{i}"] = sample(dtype, (), 100 + i, device)
        d[f"e.{i}"] = torch.empty((0, 4), dtype=dtype, device=device)
    d["embed\"quoted\\name"] = sample(torch.float32, (2, 2), 999, device)
    return d


def checks(out: str, work: str, device: str) -> None:
    def check(name: str, fn: Any) -> None:
        try:
            detail = fn()
            passed = detail is None or detail is True
        except Exception as e:  # a failed check is a result, not the end of the run
            passed, detail = False, f"{type(e).__name__}: {e}"
        emit(out, kind="check", check=name, passed=passed,
             **({} if passed else {"detail": str(detail)[:500]}))

    tensors = mixed(device)
    meta = {"format": "pt"}
    fpath = os.path.join(work, "ferry.safetensors")
    spath = os.path.join(work, "st.safetensors")
    ftorch.save_file(tensors, fpath, metadata=meta)
    if st is not None:
        st.save_file(tensors, spath, metadata=meta)
        check("byte-identical save_file (mixed dtypes, zero-size, scalar, metadata)",
              lambda: files_equal(fpath, spath) or "files differ")
        check("byte-identical save() bytes",
              lambda: ftorch.save(tensors, metadata=meta) == st.save(tensors, metadata=meta)
              or "bytes differ")
        check("byte-identical with no metadata",
              lambda: ftorch.save(tensors) == st.save(tensors) or "bytes differ")
        # safetensors.torch cannot load every dtype it saves (its _TYPES lacks F8_E8M0 in 0.8):
        # that direction covers the dtypes its loader knows, and says which it left out.
        loadable = set(getattr(st, "_TYPES", {}).values()) or {t.dtype for t in tensors.values()}
        readable = {k: v for k, v in tensors.items() if v.dtype in loadable}
        left_out = sorted({str(v.dtype) for v in tensors.values() if v.dtype not in loadable})
        emit(out, kind="note", note="dtypes safetensors.torch.load_file cannot load",
             dtypes=left_out)
        fpath2 = os.path.join(work, "ferry-readable.safetensors")
        ftorch.save_file(readable, fpath2, metadata=meta)
        check("safetensors.torch.load_file reads ferry's file, every tensor equal",
              lambda: equal_dicts(readable, st.load_file(fpath2, device="cpu")) or None)
        check("ferry load_file reads safetensors' file, every tensor equal",
              lambda: equal_dicts(tensors, ftorch.load_file(spath, device=device)) or None)
        check("safe_open metadata of ferry's file",
              lambda: st.safe_open(fpath, "pt").metadata() == meta or "metadata differs")
    check("ferry load_file reads ferry's file, every tensor equal",
          lambda: equal_dicts(tensors, ftorch.load_file(fpath, device=device)) or None)

    ck = os.path.join(work, "sharded")
    if st is not None:
        tensors = readable  # read back with safetensors.torch below
    ferry.save_checkpoint(tensors, ck, max_shard_size=200, metadata=meta)
    index_path = os.path.join(ck, "model.safetensors.index.json")

    def transformers_style() -> Any:
        with open(index_path) as f:
            index = json.load(f)
        shards = sorted(set(index["weight_map"].values()))
        if len(shards) < 2:
            return f"only {len(shards)} shard(s)"
        loaded: Dict[str, torch.Tensor] = {}
        for shard in shards:
            part = (st.load_file(os.path.join(ck, shard)) if st is not None
                    else ftorch.load_file(os.path.join(ck, shard)))
            loaded.update(part)
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        if index["metadata"]["total_size"] != total:
            return f"total_size {index['metadata']['total_size']} != {total}"
        return equal_dicts(tensors, loaded) or None

    check("sharded save read through its index (transformers style)", transformers_style)
    check("sharded save read by ferry.load_checkpoint",
          lambda: equal_dicts(tensors, ferry.load_checkpoint(ck, device=device)) or None)
    remove(ck)
    remove(fpath)
    remove(spath)
    remove(os.path.join(work, "ferry-readable.safetensors"))


def table() -> None:
    print("\n| size | case | seconds | GB/s |\n| --- | --- | --- | --- |")
    for r in RESULTS:
        if r["kind"] == "speed":
            print(f"| {r['size']} | {r['case']} | {r['seconds']} | {r['gbps']} |")
    print("\n| size | ratio | value |\n| --- | --- | --- |")
    for r in RESULTS:
        if r["kind"] == "ratios":
            for k, v in r.items():
                if k not in ("kind", "size"):
                    print(f"| {r['size']} | {k} | {v} |")
    print("\n| check | result |\n| --- | --- |")
    for r in RESULTS:
        if r["kind"] == "check":
            print(f"| {r['check']} | {'pass' if r['passed'] else 'FAIL: ' + r.get('detail', '')} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--ferry-cli", default=os.path.join(REPO, "build", "tools", "ferry"))
    ap.add_argument("--sizes", default="4,16", help="GiB, comma-separated")
    ap.add_argument("--tiny", action="store_true", help="64 MiB, CPU when no GPU: a logic check")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    open(os.path.join(a.out, "save_bench.jsonl"), "w").close()
    work = os.environ.get("FERRY_BENCH_DIR", os.path.join(REPO, "build-bench-save"))
    os.makedirs(work, exist_ok=True)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    cli = a.ferry_cli if os.path.exists(a.ferry_cli) else ""
    emit(a.out, kind="setup", device=device, torch=torch.__version__,
         safetensors=getattr(sys.modules.get("safetensors"), "__version__", None),
         ferry=ferry.__version__, cli=cli or None, work=work)
    sizes = [64 * MIB] if a.tiny else [int(float(s) * GIB) for s in a.sizes.split(",")]
    t0 = time.perf_counter()
    checks(a.out, work, device)
    for size in sizes:
        speed(a.out, work, size, device, cli)
    emit(a.out, kind="total", seconds=round(time.perf_counter() - t0, 1))
    table()
    return 0 if all(r["passed"] for r in RESULTS if r["kind"] == "check") else 1


if __name__ == "__main__":
    sys.exit(main())
