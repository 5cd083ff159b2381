#!/usr/bin/env python3
"""Checkpoint loading, ferry against safetensors and transformers (issue 12).

    PYTHONPATH=python python3 bench/checkpoint_bench.py OUT_DIR            # the GPU machine
    PYTHONPATH=python python3 bench/checkpoint_bench.py OUT_DIR --tiny     # logic check, any box
    PYTHONPATH=python python3 bench/checkpoint_bench.py OUT_DIR --quick    # about 2 minutes there

--quick (for a call with little device time): a 4 GiB synthetic checkpoint and a Llama of about
1 billion parameters; hot: ferry, ferry with one allocation, load_file, CPU then .to, and for the
model from_pretrained; cold: ferry on the synthetic one.

Makes its own checkpoints in FERRY_BENCH_DIR (default build-bench-ckpt/ in the repository, on
a real disk, not $OUT): (a) a synthetic one of 16 GiB in 4 shards, 480 tensors of mixed dtypes,
written by safetensors.torch.save_file; (b) a Llama-style transformers model (about 3 billion
parameters, random weights, created in bf16 on the GPU) saved with save_pretrained. Each case
runs in a fresh subprocess, hot (pages cached) or cold (posix_fadvise DONTNEED on every shard
after fsync; the residency left is measured with mincore and printed). Times run from the call
to every tensor usable (torch.cuda.synchronize). Every ferry tensor is checked torch.equal to
safetensors' own load. Prints a table (GB/s, ratio to safetensors.torch.load_file) and writes
OUT_DIR/checkpoint_bench.jsonl. Budget: under 6 minutes on the H200 machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from page_cache import drop_pages, resident_fraction, warm_pages

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30
MIB = 1 << 20

# ----------------------------------------------------------------------------- page cache
# resident_fraction, drop_pages and warm_pages: bench/page_cache.py


def direct_rate(path: str, threads: int = 8, block: int = 16 * MIB) -> float:
    """The disk's O_DIRECT read rate (GB/s) over `path`, its pages dropped first: `threads`
    threads reading `block`-byte aligned blocks, the way a fast reader keeps a NVMe busy."""
    import mmap
    import threading
    drop_pages([path])
    block = max(4096, min(block, os.path.getsize(path) // 4096 * 4096))
    size = os.path.getsize(path) // block * block
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    next_block = [0]
    lock = threading.Lock()

    def worker():
        buf = mmap.mmap(-1, block)
        while True:
            with lock:
                off = next_block[0]
                next_block[0] += block
            if off >= size:
                return
            os.preadv(fd, [buf], off)

    start = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    seconds = time.perf_counter() - start
    os.close(fd)
    return size / seconds / 1e9


# ----------------------------------------------------------------------------- checkpoints


def shard_files(ckpt: str) -> List[str]:
    return sorted(os.path.join(ckpt, f) for f in os.listdir(ckpt) if f.endswith(".safetensors"))


def synthetic_plan(tiny: bool, scale: float = 1.0):
    """Per shard: large, medium and small tensors of mixed dtypes (480 in all, 16.1 GiB at
    scale 1)."""
    import torch
    kinds = [torch.bfloat16, torch.float16, torch.float32, torch.int8, torch.float8_e4m3fn
             if hasattr(torch, "float8_e4m3fn") else torch.uint8, torch.int64, torch.uint8,
             torch.bool, torch.int32, torch.float64]
    big, medium = (256 * MIB, 12 * MIB) if not tiny else (256 << 10, 12 << 10)
    big, medium = int(big * scale) // 4096 * 4096, int(medium * scale) // 4096 * 4096
    plan = []
    for shard in range(4):
        tensors = []
        for i in range(12):
            tensors.append((f"s{shard}.big.{i}", kinds[i % 3], big))
        for i in range(88):
            tensors.append((f"s{shard}.medium.{i}", kinds[i % len(kinds)], medium))
        for i in range(20):
            tensors.append((f"s{shard}.small.{i}", kinds[i % len(kinds)], [0, 1, 4, 4096][i % 4]))
        plan.append(tensors)
    return plan


def random_tensor(torch, dtype, nbytes: int, device: str):
    item = torch.empty((), dtype=dtype).element_size()
    n = nbytes // item
    shape = (n,) if n < 4096 or n % 1024 else (n // 1024, 1024)
    if nbytes == 0:
        return torch.empty((0, 3), dtype=dtype)
    if n == 1 and nbytes == item:
        shape = ()
    if dtype.is_floating_point:
        # Values, not random bits: NaNs would make torch.equal false for equal bits.
        return torch.randn(shape, device=device).to(dtype).cpu()
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, device=device).bool().cpu()
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1 << 30), min(info.max, 1 << 30), shape, device=device,
                         dtype=dtype).cpu()


def make_synthetic(path: str, tiny: bool, device: str, scale: float = 1.0) -> Dict[str, Any]:
    import torch
    try:
        from safetensors.torch import save_file
    except ImportError:
        if not tiny:
            raise
        save_file = _plain_save
    os.makedirs(path, exist_ok=True)
    done = os.path.join(path, "DONE")
    if os.path.exists(done):
        return json.load(open(done))
    start, total, count = time.perf_counter(), 0, 0
    for shard, plan in enumerate(synthetic_plan(tiny, scale)):
        tensors = {name: random_tensor(torch, dtype, nbytes, device) for name, dtype, nbytes
                   in plan}
        save_file(tensors, os.path.join(path, f"synthetic-{shard + 1:05d}-of-00004.safetensors"),
                  metadata={"format": "pt", "bench": "ferry"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        count += len(tensors)
        del tensors
    info = {"bytes": total, "tensors": count, "shards": 4,
            "seconds_to_make": time.perf_counter() - start}
    json.dump(info, open(done, "w"))
    return info


def llama_config(tiny: bool):
    from transformers import LlamaConfig
    if not tiny and os.environ.get("FERRY_BENCH_QUICK") == "1":
        # About 1.1 billion parameters (2.2 GB in bf16).
        return LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                           num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                           tie_word_embeddings=False, torch_dtype="bfloat16")
    if tiny:
        return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                           tie_word_embeddings=False)
    # About 3.0 billion parameters (6 GB in bf16), Llama-3-like proportions.
    return LlamaConfig(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                       num_attention_heads=24, num_key_value_heads=8, vocab_size=32000,
                       tie_word_embeddings=False, torch_dtype="bfloat16")


def build_model(tiny: bool, device: str):
    import contextlib
    import torch
    from transformers import LlamaForCausalLM
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    # Made where it is used (torch 2's device context); a torch before 2.0 (the CPU machine's
    # 1.13) has none, and the model is made in host memory, then moved.
    where = torch.device(device)
    try:
        with where if hasattr(where, "__enter__") else contextlib.nullcontext():
            model = LlamaForCausalLM(llama_config(tiny))
    finally:
        torch.set_default_dtype(previous)
    return model.to(device).eval()


def count_tensors(ckpt: str) -> int:
    """Tensors in the checkpoint's shards, by their safetensors headers."""
    count = 0
    for f in shard_files(ckpt):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            count += sum(1 for k in json.loads(fh.read(n)) if k != "__metadata__")
    return count


def make_model(path: str, tiny: bool, device: str) -> Dict[str, Any]:
    done = os.path.join(path, "DONE")
    if os.path.exists(done):
        return json.load(open(done))
    start = time.perf_counter()
    model = build_model(tiny, device)
    model.save_pretrained(path, safe_serialization=True,
                          max_shard_size="2GB" if not tiny else "200KB")
    params = sum(p.numel() for p in model.parameters())
    info = {"parameters": params, "tensors": count_tensors(path),
            "shards": len(shard_files(path)),
            "bytes": sum(os.path.getsize(f) for f in shard_files(path)),
            "seconds_to_make": time.perf_counter() - start}
    json.dump(info, open(done, "w"))
    return info


# ----------------------------------------------------------------------------- cases (child)


def sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def st_load_file(path: str, device: str) -> Dict[str, Any]:
    """safetensors.torch.load_file; in --tiny runs on a machine without the package, a plain
    reader of the format (struct + json + torch.frombuffer), independent of ferry."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        if os.environ.get("FERRY_BENCH_TINY") != "1":
            raise
        return _plain_load(path, device)
    return load_file(path, device=device)


_TORCH = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I8": "int8",
          "U8": "uint8", "I32": "int32", "I64": "int64", "BOOL": "bool", "I16": "int16",
          "F8_E4M3": "float8_e4m3fn"}


def _plain_load(path: str, device: str) -> Dict[str, Any]:
    import struct
    import torch
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        raw = torch.frombuffer(bytearray(data[8 + n + b:8 + n + end]) or bytearray(1),
                               dtype=torch.uint8)[:end - b]
        out[name] = raw.view(getattr(torch, _TORCH[e["dtype"]])).reshape(e["shape"]).to(device)
    return out


def _plain_save(tensors: Dict[str, Any], path: str, metadata: Dict[str, str]) -> None:
    import struct
    names = {v: k for k, v in _TORCH.items()}
    header: Dict[str, Any] = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, t in tensors.items():
        b = t.contiguous().reshape(-1).view(__import__("torch").uint8).numpy().tobytes() \
            if t.numel() else b""
        header[name] = {"dtype": names[str(t.dtype).split(".")[1]], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def comparable(torch, t):
    """`t`, or its bits where torch.equal has no kernel for the dtype (the float8 kinds)."""
    if t.dtype.is_floating_point and t.element_size() == 1:
        return t.view(torch.uint8)
    return t


def check_equal(torch, got: Dict[str, Any], ckpt: str, device: str) -> Dict[str, Any]:
    """Every tensor torch.equal to safetensors' own load (shard by shard, to bound memory)."""
    checked, bad = 0, []
    for f in shard_files(ckpt):
        ref = st_load_file(f, device)
        for name, t in ref.items():
            mine = got.get(name)
            ok = (mine is not None and mine.dtype == t.dtype and mine.shape == t.shape and
                  torch.equal(comparable(torch, mine), comparable(torch, t)))
            checked += 1
            if not ok:
                bad.append(name)
        del ref
    missing = len(got) - checked
    return {"checked": checked, "mismatched": bad[:10], "n_mismatched": len(bad),
            "extra_in_ferry": missing, "equal": not bad and missing == 0}


def run_case(case: str, ckpt: str, device: str, tiny: bool, cold: bool) -> Dict[str, Any]:
    import torch
    shards = shard_files(ckpt)
    result: Dict[str, Any] = {"case": case, "checkpoint": os.path.basename(ckpt),
                              "resident_before": resident_fraction(shards)}
    if device.startswith("cuda"):
        torch.cuda.init()
        torch.empty(1, device=device)  # the CUDA context is not part of any loader's time
        torch.cuda.reset_peak_memory_stats()
    model = None
    if "state_dict" in case:
        model = build_model(tiny, device)  # the model a user loads into; not timed
        sync(torch, device)
    base_memory = 0
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        base_memory = torch.cuda.memory_allocated()
    import ferry
    start = time.perf_counter()
    tensors: Optional[Dict[str, Any]] = None
    if case in ("ferry", "ferry-state_dict"):
        tensors = ferry.load_checkpoint(ckpt, device=device)
    elif case == "ferry-one_allocation":
        tensors = ferry.load_checkpoint(ckpt, device=device, one_allocation=True)
    elif case in ("safetensors.load_file", "safetensors-state_dict"):
        tensors = {}
        for f in shards:
            tensors.update(st_load_file(f, device))
    elif case == "safe_open":
        from safetensors import safe_open
        tensors = {}
        for f in shards:
            with safe_open(f, framework="pt", device=device) as h:
                for k in h.keys():
                    tensors[k] = h.get_tensor(k)
    elif case == "cpu-then-to":
        tensors = {}
        for f in shards:
            for k, v in st_load_file(f, "cpu").items():
                tensors[k] = v.to(device)
    elif case == "from_pretrained":
        from transformers import LlamaForCausalLM
        try:
            model = LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=torch.bfloat16,
                                                     device_map=device)
        except (ImportError, ValueError) as e:  # device_map needs accelerate
            result["note"] = f"device_map unavailable ({e}); from_pretrained then .to()"
            model = LlamaForCausalLM.from_pretrained(ckpt, torch_dtype=torch.bfloat16).to(device)
    else:
        raise SystemExit(f"unknown case {case}")
    sync(torch, device)
    seconds = time.perf_counter() - start
    nbytes = (sum(t.numel() * t.element_size() for t in tensors.values()) if tensors is not None
              else sum(p.numel() * p.element_size() for p in model.state_dict().values()))
    result.update({"seconds": seconds, "bytes": nbytes, "gbps": nbytes / seconds / 1e9,
                   "tensors": len(tensors) if tensors is not None else None})
    if device.startswith("cuda"):
        result["peak_gpu_bytes_over_tensors"] = (torch.cuda.max_memory_allocated() - base_memory
                                                 ) / max(nbytes, 1)
    result["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if case.startswith("ferry"):
        report = ferry.last_load_report()
        result["ferry_seconds"] = report.seconds
        result["routes"] = [r.verdict for r in report.routes]
        result["host_routes"] = [f"{r.path}: {r.reason}" for r in report.host_routes]
    if model is not None and tensors is not None:
        t0 = time.perf_counter()
        model.load_state_dict(tensors, strict=True)
        sync(torch, device)
        result["load_state_dict_seconds"] = time.perf_counter() - t0
        if case.startswith("ferry") and not cold:
            result["check"] = check_equal(torch, dict(model.state_dict()), ckpt, device)
    elif case.startswith("ferry") and not cold:
        result["check"] = check_equal(torch, tensors, ckpt, device)
    return result


# ----------------------------------------------------------------------------- driver


def child(args: List[str], env: Dict[str, str]) -> Dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child"] + args
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"case": args[1], "error": (p.stderr or p.stdout)[-2000:]}
    return json.loads(lines[-1])


def table(rows: List[Dict[str, Any]]) -> str:
    base: Dict[tuple, float] = {}
    for r in rows:
        if r.get("case") == "safetensors.load_file" and "gbps" in r:
            base[(r["checkpoint"], r["temperature"])] = r["gbps"]
    out = [f"{'checkpoint':<11} {'temp':<5} {'case':<24} {'GiB':>7} {'s':>8} {'GB/s':>7} "
           f"{'x st':>6} {'resident':>8} {'peak/GPU':>8}  check"]
    for r in rows:
        if "error" in r:
            out.append(f"{r.get('checkpoint', ''):<11} {r.get('temperature', ''):<5} "
                       f"{r['case']:<24} ERROR: {r['error'].splitlines()[-1] if r['error'] else ''}")
            continue
        b = base.get((r["checkpoint"], r["temperature"])) or base.get((r["checkpoint"], "hot"))
        check = r.get("check", {})
        out.append(
            f"{r['checkpoint']:<11} {r['temperature']:<5} {r['case']:<24} "
            f"{r['bytes'] / GIB:7.2f} {r['seconds']:8.3f} {r['gbps']:7.2f} "
            f"{(r['gbps'] / b) if b else float('nan'):6.1f} {r['resident_before']:8.2f} "
            f"{r.get('peak_gpu_bytes_over_tensors', float('nan')):8.2f}  "
            f"{'' if not check else ('equal' if check['equal'] else 'MISMATCH')}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--tiny", action="store_true", help="tiny checkpoints: checks the logic")
    ap.add_argument("--quick", action="store_true",
                    help="4 GiB synthetic, a 1 B model, fewer cases (little device time)")
    ap.add_argument("--child", nargs=5, metavar=("CKPT", "CASE", "DEVICE", "TINY", "TEMP"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        ckpt, case, device, tiny, temperature = a.child
        r = run_case(case, ckpt, device, tiny == "1", temperature == "cold")
        print(json.dumps(r))
        return 0
    if not a.out:
        ap.error("name an output folder")
    import torch
    os.makedirs(a.out, exist_ok=True)
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    suffix = "-tiny" if a.tiny else "-quick" if a.quick else ""
    work = os.environ.get("FERRY_BENCH_DIR", os.path.join(REPO, "build-bench-ckpt" + suffix))
    if a.quick:
        os.environ["FERRY_BENCH_QUICK"] = "1"
    env = dict(os.environ)
    if a.tiny:
        env["FERRY_BENCH_TINY"] = os.environ["FERRY_BENCH_TINY"] = "1"
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.perf_counter()
    synthetic = os.path.join(work, "synthetic")
    model = os.path.join(work, "llama")
    info = {"device": device, "work_dir": work, "torch": torch.__version__,
            "synthetic": make_synthetic(synthetic, a.tiny, device, 0.25 if a.quick else 1.0)}
    try:
        import transformers
        info["transformers"] = transformers.__version__
        info["model"] = make_model(model, a.tiny, device)
    except ImportError as e:
        info["model"] = {"skipped": f"transformers is not installed ({e})"}
        model = ""
    try:
        import safetensors
        info["safetensors"] = safetensors.__version__
    except ImportError:
        info["safetensors"] = "absent: the bench's plain writer and reader stand in (--tiny only)"
        skip_safe_open = True
    else:
        skip_safe_open = False
    info["fs"] = subprocess.run(["stat", "-f", "-c", "%T", work], capture_output=True,
                                text=True).stdout.strip()
    info["seconds_to_prepare"] = time.perf_counter() - t0
    shards = shard_files(synthetic)
    info["odirect_gbps"] = direct_rate(shards[-1])
    print(json.dumps(info), flush=True)

    plans = [(synthetic, "hot", c) for c in ("ferry", "ferry-one_allocation",
                                             "safetensors.load_file", "safe_open", "cpu-then-to")
             if not (skip_safe_open and c == "safe_open") and not (a.quick and c == "safe_open")]
    plans += [(synthetic, "cold", "ferry")]
    if model and a.quick:
        plans += [(model, "hot", c) for c in ("ferry-state_dict", "safetensors.load_file",
                                              "from_pretrained")]
    elif model:
        plans += [(model, "hot", c) for c in ("ferry-state_dict", "safetensors.load_file",
                                              "safe_open", "cpu-then-to", "from_pretrained")
                  if not (skip_safe_open and c == "safe_open")]
        plans += [(model, "cold", "ferry-state_dict"), (model, "cold", "safetensors.load_file")]
    rows = []
    jsonl = os.path.join(a.out, "checkpoint_bench.jsonl")
    with open(jsonl, "w") as out:
        out.write(json.dumps({"info": info}) + "\n")
        for ckpt, temperature, case in plans:
            files = shard_files(ckpt)
            left = drop_pages(files) if temperature == "cold" else warm_pages(files)
            r = child([ckpt, case, device, "1" if a.tiny else "0", temperature], env)
            r.update({"temperature": temperature, "checkpoint": os.path.basename(ckpt),
                      "resident_after_prepare": left})
            if temperature == "cold" and left > 0.01:
                r["note"] = f"{left:.1%} of the pages stayed cached after DONTNEED"
            if temperature == "cold" and "gbps" in r:
                r["of_odirect"] = r["gbps"] / info["odirect_gbps"]
            rows.append(r)
            out.write(json.dumps(r) + "\n")
            out.flush()
            print(f"{r['checkpoint']} {temperature} {case}: "
                  f"{r.get('gbps', float('nan')):.2f} GB/s {r.get('error', '')[-300:]}", flush=True)
    text = table(rows)
    text += f"\ndisk O_DIRECT rate: {info['odirect_gbps']:.2f} GB/s; total {time.perf_counter() - t0:.0f} s"
    print(text)
    open(os.path.join(a.out, "checkpoint_bench.txt"), "w").write(text + "\n")
    return 0 if all("error" not in r and r.get("check", {"equal": True})["equal"] for r in rows) \
        else 1


if __name__ == "__main__":
    sys.exit(main())
