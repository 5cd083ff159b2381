#!/usr/bin/env python3
"""transformers' from_pretrained, stock against ferry.transformers (issue 31).

    PYTHONPATH=python python3 bench/transformers_bench.py MODEL_DIR [--out FILE.jsonl]

Makes, once (reused when MODEL_DIR already holds them), two checkpoints from configs, with
random weights initialised on the GPU in bf16: a Qwen2-family model of 4 GiB (hidden 2048, 24
layers, 16 heads, 2 KV heads, vocab 151936, tied embeddings; max_shard_size 1GB, 5 shards) and a
Mistral-family one of 13.5 GiB (hidden 4096, 32 layers, intermediate 14336, 8 KV heads, vocab
32000; 3 shards). Reads every shard once so they are page-cached. Then per model:

- one process loads it both ways and checks them identical (every state_dict tensor
  torch.equal, the same ties, the logits of a fixed input torch.equal);
- 3 rounds of fresh processes, stock then ferry: imports (torch, transformers, ferry, the
  model's module) and CUDA start-up are timed apart; the load phase runs from the
  from_pretrained call (device_map="cuda:0", dtype=bfloat16) to the model on the GPU after
  torch.cuda.synchronize(); peak GPU memory is torch.cuda.max_memory_allocated() over the load;
  for ferry, ferry's reads and transformers' own work (the rest of the load phase) apart.

Prints one JSON line per process (also written to --out) and a table of medians with ratios
ferry/stock, then each target of the issue met or missed. About 5 minutes on the H200 machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1 << 30

MODELS: Dict[str, Dict[str, Any]] = {
    "qwen2-4g": dict(family="qwen2", shard="1GB", config=dict(
        hidden_size=2048, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=2,
        intermediate_size=11008, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=32768)),
    "mistral-13g": dict(family="mistral", shard="5GB", config=dict(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768)),
}
ROUNDS = 3


def shards(path: str) -> List[str]:
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))


# ----------------------------------------------------------------------------- children


def make(name: str, path: str) -> None:
    """Builds model `name` on the GPU in bf16 and saves it into `path`."""
    import torch
    import transformers
    spec = MODELS[name]
    config_class = {"qwen2": transformers.Qwen2Config,
                    "mistral": transformers.MistralConfig}[spec["family"]]
    config = config_class(**spec["config"])
    torch.manual_seed(31)
    with torch.device("cuda:0"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(path, max_shard_size=spec["shard"])
    with open(os.path.join(path, ".complete"), "w") as f:
        f.write(json.dumps({"shards": len(shards(path))}))


def fixed_input(torch: Any) -> Any:
    return (torch.arange(32, device="cuda:0") * 9973 % 30000).reshape(2, 16)


def verify(path: str) -> Dict[str, Any]:
    """Loads `path` stock and through ferry in this process and compares them exactly."""
    import torch
    import transformers
    import ferry.transformers as ft
    auto = transformers.AutoModelForCausalLM
    kwargs = dict(device_map="cuda:0", dtype=torch.bfloat16)
    stock = auto.from_pretrained(path, **kwargs)
    with ft.loading():
        mine = auto.from_pretrained(path, **kwargs)
    report = ft.last_load_report()
    s_state, m_state = stock.state_dict(), mine.state_dict()
    unequal = [k for k in s_state if k not in m_state or s_state[k].dtype != m_state[k].dtype
               or not torch.equal(s_state[k], m_state[k])]

    def ties(model: Any) -> List[List[str]]:
        groups: Dict[int, List[str]] = {}
        for n, t in model.named_parameters(remove_duplicate=False):
            groups.setdefault(t.data_ptr(), []).append(n)
        return sorted(sorted(g) for g in groups.values() if len(g) > 1)

    with torch.no_grad():
        logits_equal = torch.equal(stock(input_ids=fixed_input(torch)).logits,
                                   mine(input_ids=fixed_input(torch)).logits)
    return {"kind": "verify", "taken": report.taken if report else None,
            "tensors": len(s_state), "unequal": unequal[:10],
            "same_keys": list(s_state) == list(m_state),
            "ties_equal": ties(stock) == ties(mine), "ties": ties(mine),
            "logits_equal": logits_equal}


def case(path: str, how: str) -> Dict[str, Any]:
    """One load in this (fresh) process, timed by phase."""
    start = time.perf_counter()
    import torch
    import transformers
    import ferry.transformers as ft
    config = transformers.AutoConfig.from_pretrained(path)
    getattr(transformers, config.architectures[0])  # the model's module, imported lazily
    imports = time.perf_counter() - start
    t = time.perf_counter()
    torch.empty(1, device="cuda:0")
    torch.cuda.synchronize()
    cuda_init = time.perf_counter() - t
    if how == "ferry":
        ft.enable()
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, device_map="cuda:0",
                                                              dtype=torch.bfloat16)
    torch.cuda.synchronize()
    load = time.perf_counter() - t
    out: Dict[str, Any] = {
        "kind": "case", "how": how, "imports_s": imports, "cuda_init_s": cuda_init,
        "load_s": load, "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
        "model_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "device": str(next(model.parameters()).device)}
    report = ft.last_load_report()
    if how == "ferry" and report is not None:
        out.update(taken=report.taken, ferry_read_s=report.read_seconds,
                   weight_load_s=report.load_seconds, transformers_own_s=load - report.read_seconds,
                   files=[{"file": os.path.basename(f.path), "taken": f.taken, "bytes": f.bytes,
                           "seconds": f.seconds, "reason": f.reason} for f in report.files])
    return out


# ----------------------------------------------------------------------------- the parent


def child(args: List[str], env: Dict[str, str]) -> Dict[str, Any]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__)] + args, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"transformers_bench: {' '.join(args)} failed (exit {proc.returncode})")
    result = json.loads(lines[-1][len("RESULT "):])
    result["process_wall_s"] = wall
    return result


def page_cache(paths: List[str]) -> None:
    buf = bytearray(64 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def median(rows: List[Dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", nargs="?")
    parser.add_argument("--out", default="")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--child", nargs=3, metavar=("WHAT", "NAME", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, name, path = args.child
        result = (make(name, path) if what == "make" else verify(path) if what == "verify"
                  else case(path, what))
        print("RESULT " + json.dumps(result or {}), flush=True)
        return
    if not args.model_dir:
        parser.error("MODEL_DIR is needed")

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [os.path.join(REPO, "python"), env.get("PYTHONPATH", "")] if p)
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("HF_HUB_OFFLINE", "1")
    out = open(args.out, "a") if args.out else None

    def emit(record: Dict[str, Any]) -> None:
        line = json.dumps(record)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    summary = []
    for name in args.models.split(","):
        path = os.path.join(args.model_dir, name)
        if not os.path.exists(os.path.join(path, ".complete")):
            os.makedirs(path, exist_ok=True)
            t = time.perf_counter()
            child(["--child", "make", name, path], env)
            emit({"model": name, "kind": "make", "seconds": time.perf_counter() - t})
        files = shards(path)
        nbytes = sum(os.path.getsize(f) for f in files)
        page_cache(files)
        check = child(["--child", "verify", name, path], env)
        check.update(model=name)
        emit(check)
        rows: Dict[str, List[Dict[str, Any]]] = {"stock": [], "ferry": []}
        for r in range(args.rounds):
            for how in ("stock", "ferry"):
                result = child(["--child", how, name, path], env)
                result.update(model=name, round=r, checkpoint_bytes=nbytes, shards=len(files),
                              gbps=nbytes / result["load_s"] / 1e9)
                emit(result)
                rows[how].append(result)
        summary.append((name, nbytes, len(files), check, rows))

    print()
    head = ("model", "GiB", "shards", "stock load s", "GB/s", "ferry load s", "GB/s",
            "speed-up", "peak GPU ferry/stock", "ferry reads s", "transformers own s",
            "imports s", "CUDA init s", "process s stock", "process s ferry", "identical")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    verdicts = []
    for name, nbytes, n, check, rows in summary:
        s, f = rows["stock"], rows["ferry"]
        s_load, f_load = median(s, "load_s"), median(f, "load_s")
        peak = median(f, "peak_gpu_bytes") / median(s, "peak_gpu_bytes")
        identical = (check["taken"] == "ferry" and not check["unequal"] and check["same_keys"]
                     and check["ties_equal"] and check["logits_equal"])
        served = all(r.get("taken") == "ferry" for r in f)
        print(" | ".join([
            name, f"{nbytes / GIB:.2f}", str(n), f"{s_load:.3f}", f"{nbytes / s_load / 1e9:.1f}",
            f"{f_load:.3f}", f"{nbytes / f_load / 1e9:.1f}", f"{s_load / f_load:.2f}x",
            f"{peak:.3f}", f"{median(f, 'ferry_read_s'):.3f}",
            f"{median(f, 'transformers_own_s'):.3f}",
            f"{median(s + f, 'imports_s'):.1f}", f"{median(s + f, 'cuda_init_s'):.2f}",
            f"{median(s, 'process_wall_s'):.1f}", f"{median(f, 'process_wall_s'):.1f}",
            "yes" if identical and served else "NO"]))
        speed = 3.0 if nbytes < 8 * GIB else 4.0
        verdicts.append((f"{name}: identical to stock, every file read by ferry",
                         identical and served))
        verdicts.append((f"{name}: load phase >= {speed:.0f}x stock", s_load / f_load >= speed))
        if nbytes >= 13 * GIB:
            verdicts.append((f"{name}: load phase >= 25 GB/s", nbytes / f_load / 1e9 >= 25))
        verdicts.append((f"{name}: peak GPU memory <= 1.1x stock", peak <= 1.1))
    print()
    for text, ok in verdicts:
        print(f"{'met   ' if ok else 'MISSED'} {text}")
    if out:
        out.close()


if __name__ == "__main__":
    main()
