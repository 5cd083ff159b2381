#!/usr/bin/env python3
"""ferry.iter_weights for inference engines (issue 49): its rate against load_checkpoint's, its
peak GPU memory against the model plus the budget, and tensor-parallel slice reads.

    PYTHONPATH=python /usr/bin/python3 bench/iter_weights_bench.py OUT_DIR              # GPU 0
    PYTHONPATH=python /usr/bin/python3 bench/iter_weights_bench.py OUT_DIR --device cpu --size 64MiB

Writes a synthetic Llama-style checkpoint (bf16; fused qkv_proj and gate_up_proj, o_proj and
down_proj, norms, embed and lm_head) of about --size with ferry.save_checkpoint into --dir
(default build-bench-weights/ in the repository: a real disk), pages cached. Then, each in a
fresh process, one after another:
  load:    ferry.load_checkpoint(device), timed to torch.cuda.synchronize;
  iter:    an engine's loop: the model's parameters allocated first (torch.empty), then
           for name, t in iter_weights(device, memory_budget): param.copy_(t); peak memory is
           torch.cuda.max_memory_allocated, torch.cuda.max_memory_reserved (the caching
           allocator's segments) and the driver's used memory (cudaMemGetInfo, sampled every
           millisecond), each less the process's before; the claim is peak <= model + budget;
  tp W:    for W in --tp (2 4 8): W processes in sequence, rank r reading its slices
           (Shard: qkv/gate_up dim 0 by sub-block, o/down dim 1, embed/lm_head dim 0, norms
           whole), each slice checked against torch.tensor_split of the full tensor; the
           bytes read (report and ferry.stats) of all W ranks against the checkpoint's.
Prints a table and writes OUT_DIR/iter_weights_bench.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB, GIB = 1 << 20, 1 << 30


def parse_size(text: str) -> int:
    units = {"KIB": 1 << 10, "MIB": MIB, "GIB": GIB, "KB": 1000, "MB": 10**6, "GB": 10**9}
    t = text.strip().upper()
    for unit, mult in units.items():
        if t.endswith(unit):
            return int(float(t[:-len(unit)]) * mult)
    return int(t)


def shapes(size: int) -> Dict[str, Any]:
    """name -> (shape, fused sub-blocks or None, split dim or None) of a model of about `size`
    bytes in bf16, in file order."""
    h = 4096 if size >= 4 * GIB else 1024 if size >= 256 * MIB else 256
    inter = (h * 11 // 4 + 127) // 128 * 128
    vocab = 32000 if h >= 1024 else 4096
    per_layer = 2 * (3 * h * h + 2 * inter * h + h * h + h * inter + 2 * h)
    layers = max(1, (size - 4 * vocab * h) // per_layer)
    out: Dict[str, Any] = {"model.embed_tokens.weight": ((vocab, h), None, 0)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ((h,), None, None)
        out[p + "self_attn.qkv_proj.weight"] = ((3 * h, h), (h, h, h), 0)
        out[p + "self_attn.o_proj.weight"] = ((h, h), None, 1)
        out[p + "post_attention_layernorm.weight"] = ((h,), None, None)
        out[p + "mlp.gate_up_proj.weight"] = ((2 * inter, h), (inter, inter), 0)
        out[p + "mlp.down_proj.weight"] = ((h, inter), None, 1)
    out["model.norm.weight"] = ((h,), None, None)
    out["lm_head.weight"] = ((vocab, h), None, 0)
    return out


def make(directory: str, size: int, device: str) -> None:
    import torch
    import ferry
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        return
    g = torch.Generator(device=device).manual_seed(0)
    tensors = {n: torch.randn(s, generator=g, device=device, dtype=torch.bfloat16)
               for n, (s, _, _) in shapes(size).items()}
    ferry.save_checkpoint(tensors, directory, max_shard_size="2GiB")


def sync(device: str) -> None:
    import torch
    if device != "cpu":
        torch.cuda.synchronize()


class DriverPeak:
    """The most GPU memory in use (cudaMemGetInfo), sampled every millisecond."""

    def __init__(self, device: str) -> None:
        import torch
        self.torch, self.on = torch, device != "cpu"
        self.peak, self._stop = 0, threading.Event()
        if self.on:
            self.base = self.used()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def used(self) -> int:
        free, total = self.torch.cuda.mem_get_info()
        return int(total - free)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.used() - self.base)
            time.sleep(0.001)

    def stop(self) -> int:
        if self.on:
            self._stop.set()
            self._thread.join()
        return self.peak


def case(kind: str, ckpt: str, device: str, budget: int, world: int, rank: int) -> Dict[str, Any]:
    """One case in this (fresh) process."""
    import torch
    import ferry
    from ferry import Shard
    plan = shapes_of(ckpt)
    total = sum(nbytes for _, nbytes in plan.values())
    out: Dict[str, Any] = {"case": kind, "device": device, "bytes": total}
    if device != "cpu":
        torch.cuda.init()
        torch.empty(1, device=device)
        sync(device)
        base = torch.cuda.memory_allocated()
        base_reserved = torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
    driver = DriverPeak(device)
    start = time.perf_counter()
    if kind == "load":
        tensors = ferry.load_checkpoint(ckpt, device=device)
        sync(device)
        out["seconds"] = time.perf_counter() - start
        del tensors
    elif kind in ("iter", "iter_unguarded"):
        from ferry import _weights
        if kind == "iter_unguarded":  # torch's reservation not held to the budget (NOTES §50)
            _weights._cache_of = lambda fw: (None, "unguarded by the bench")
        # The batch policy, for experiments (NOTES §59): a batch's bytes at most, batches at once.
        if os.environ.get("IW_BATCH_CAP"):
            _weights._BATCH_CAP = int(os.environ["IW_BATCH_CAP"])
        if os.environ.get("IW_IN_FLIGHT"):
            _weights._IN_FLIGHT = int(os.environ["IW_IN_FLIGHT"])
        calls: Dict[str, List[float]] = {"stats": [], "free_blocks": []}
        for method in calls:  # the time asking the allocator, by question
            def timed(self: Any, *a: Any, _f: Any = getattr(_weights._TorchCache, method),
                      _times: List[float] = calls[method]) -> Any:
                t = time.perf_counter()
                try:
                    return _f(self, *a)
                finally:
                    _times.append(time.perf_counter() - t)
            setattr(_weights._TorchCache, method, timed)
        params = {n: torch.empty(s, dtype=torch.bfloat16, device=device)
                  for n, (s, _) in plan.items()}
        start = time.perf_counter()
        it = ferry.iter_weights(ckpt, device=device, memory_budget=budget)
        for name, t in it:
            params[name].copy_(t)
            del t
        sync(device)
        out["seconds"] = time.perf_counter() - start
        out["report"] = it.report.to_dict()
        out["asked"] = {k: [len(v), sum(v)] for k, v in calls.items()}
        out["model"] = total
        del params
    else:
        rules = {n: (None if dim is None else Shard(dim, rank, world, blocks))
                 for n, (dim, blocks) in rule_of(ckpt).items()}
        before = ferry.stats().bytes_read
        it = ferry.iter_weights(ckpt, device=device, memory_budget=budget, shard=rules)
        got = dict(it)
        sync(device)
        out["seconds"] = time.perf_counter() - start
        out["read"], out["storage"] = it.report.bytes_read, ferry.stats().bytes_read - before
        out["world"], out["rank"] = world, rank
        bad = []
        for name, t in got.items():  # after the timing: reads the full tensors again
            full = ferry.load_checkpoint(ckpt, device=device, names=[name])[name]
            rule = rules[name]
            if rule is not None:
                parts = torch.split(full, list(rule.blocks or (full.shape[rule.dim],)), rule.dim)
                full = torch.cat([torch.tensor_split(p, world, rule.dim)[rank] for p in parts],
                                 rule.dim)
            if not torch.equal(full, t):
                bad.append(name)
        out["mismatched"] = bad
    out["driver_peak"] = driver.stop()
    if device != "cpu":
        out["allocated_peak"] = torch.cuda.max_memory_allocated() - base
        out["reserved_peak"] = torch.cuda.max_memory_reserved() - base_reserved
    out["gb_s"] = out.get("read", total) / out["seconds"] / 1e9
    return out


def shapes_of(ckpt: str) -> Dict[str, Any]:
    from ferry.checkpoint import Checkpoint
    return {n: (e.shape, e.nbytes) for n, e in Checkpoint(ckpt).entries.items()}


def rule_of(ckpt: str) -> Dict[str, Any]:
    """name -> (split dim or None, fused blocks) for the checkpoint's names (from its shapes)."""
    out = {}
    for name, (shape, _) in shapes_of(ckpt).items():
        h = shape[-1]
        if len(shape) == 1:
            out[name] = (None, None)
        elif "qkv_proj" in name:
            out[name] = (0, (h, h, h))
        elif "gate_up_proj" in name:
            out[name] = (0, (shape[0] // 2, shape[0] // 2))
        elif "o_proj" in name or "down_proj" in name:
            out[name] = (1, None)
        else:
            out[name] = (0, None)
    return out


def child(args: List[str]) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python") + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", *args], env=env,
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"child {args} exited {r.returncode}:\n{r.stderr[-4000:]}")
    result: Dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("out", nargs="?", help="where iter_weights_bench.jsonl goes (default: .)")
    ap.add_argument("--device", default="cuda:0", help="cuda:N or cpu (default cuda:0)")
    ap.add_argument("--size", default="16GiB", help="checkpoint size (default 16GiB)")
    ap.add_argument("--budget", default="256MiB", help="iter_weights' memory_budget")
    ap.add_argument("--tp", default="2,4,8", help="world sizes to simulate (default 2,4,8)")
    ap.add_argument("--rounds", type=int, default=3, help="load and iter runs each (median)")
    ap.add_argument("--unguarded", action="store_true",
                    help="also iter_weights without holding torch's reservation to the budget")
    ap.add_argument("--dir", default=os.path.join(REPO, "build-bench-weights"))
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, ckpt, device, budget, world, rank = a.child
        print(json.dumps(case(kind, ckpt, device, int(budget), int(world), int(rank))))
        return 0
    size, budget = parse_size(a.size), parse_size(a.budget)
    ckpt = os.path.join(a.dir, f"llama-{size}")
    os.makedirs(ckpt, exist_ok=True)
    make(ckpt, size, "cpu" if a.device == "cpu" else a.device)
    rows = []
    kinds = ("load", "iter") + (("iter_unguarded",) if a.unguarded else ())
    for _ in range(a.rounds):
        for kind in kinds:
            rows.append(child([kind, ckpt, a.device, str(budget), "1", "0"]))
    for world in [int(w) for w in a.tp.split(",") if w]:
        ranks = [child(["tp", ckpt, a.device, str(budget), str(world), str(r)])
                 for r in range(world)]
        total = ranks[0]["bytes"]
        rows.append({"case": f"tp {world}", "world": world, "bytes": total,
                     "read": sum(r["read"] for r in ranks),
                     "storage": sum(r["storage"] for r in ranks),
                     "read_x": sum(r["read"] for r in ranks) / total,
                     "max_rank_share_x": max(r["read"] for r in ranks) * world / total,
                     "mismatched": sorted({n for r in ranks for n in r["mismatched"]}),
                     "gb_s": sum(r["read"] for r in ranks) / sum(r["seconds"] for r in ranks) / 1e9,
                     "ranks": ranks})
    os.makedirs(a.out or ".", exist_ok=True)
    with open(os.path.join(a.out or ".", "iter_weights_bench.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    med = {}
    for kind in kinds:
        rates = sorted(r["gb_s"] for r in rows if r["case"] == kind)
        med[kind] = rates[len(rates) // 2]
    print(f"checkpoint {size / GIB:.2f} GiB on {a.device}, budget {budget / MIB:.0f} MiB")
    print(f"load_checkpoint  {med['load']:7.2f} GB/s (median of {a.rounds})")
    for kind in kinds[1:]:
        print(f"{kind:<16} {med[kind]:7.2f} GB/s  {med[kind] / med['load']:.2f}x load")
    for r in rows:
        if r["case"].startswith("iter") and "allocated_peak" in r:
            rep = r["report"]
            asked = ", ".join(f"{k} {n} in {t * 1e3:.1f} ms" for k, (n, t) in r["asked"].items())
            print(f"  {r['case']:<14} {r['gb_s']:6.2f} GB/s; asked: {asked or 'nothing'}")
            print(f"    peak over model: allocated "
                  f"{(r['allocated_peak'] - r['model']) / MIB:7.1f} MiB, torch reserved "
                  f"{(r['reserved_peak'] - r['model']) / MIB:7.1f} MiB, driver "
                  f"{(r['driver_peak'] - r['model']) / MIB:7.1f} MiB (budget {budget / MIB:.0f} "
                  f"MiB, staging {rep['staging_bytes'] / MIB:.0f} MiB); allocator waits "
                  f"{rep.get('allocator_waits')}, releases {rep.get('cache_releases')}, "
                  f"{rep.get('allocator_seconds', 0) * 1e3:.1f} ms asking it")
    for r in rows:
        if r["case"].startswith("tp "):
            print(f"{r['case']:<6} read {r['read_x']:.4f}x the checkpoint (ferry.stats "
                  f"{r['storage'] / r['bytes']:.4f}x), largest rank {r['max_rank_share_x']:.3f}x "
                  f"its share, {r['gb_s']:.2f} GB/s, mismatched: {r['mismatched'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
