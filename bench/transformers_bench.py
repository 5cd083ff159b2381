#!/usr/bin/env python3
"""transformers' from_pretrained: stock, through ferry.transformers, and ferry's bare load of the
same files (issues 31 and 48).

    PYTHONPATH=python python3 bench/transformers_bench.py MODEL_DIR [--out FILE.jsonl]

Makes, once (reused when MODEL_DIR already holds them), two checkpoints from configs, with
random weights initialised on the GPU in bf16: a Qwen2-family model of 4 GiB (hidden 2048, 24
layers, 16 heads, 2 KV heads, vocab 151936, tied embeddings; max_shard_size 1GB, 5 shards) and a
Mistral-family one of 13.5 GiB (hidden 4096, 32 layers, intermediate 14336, 8 KV heads, vocab
32000; 3 shards). Reads every shard once so they are page-cached. Then per model:

- one process loads it both ways and checks them identical (every state_dict tensor
  torch.equal, the same ties, the logits of a fixed input torch.equal);
- rounds of fresh processes, one per way (stock from_pretrained, ferry's from_pretrained,
  ``ferry.load_checkpoint`` bare): after the imports (torch, transformers, ferry; timed apart),
  CUDA's start and the lookup of ``transformers.AutoModelForCausalLM`` (which imports the auto
  classes' module and generation's dependencies: ``auto_class_s``, apart), the first call of the
  process (transformers still imports the model's
  modules lazily in it, the caching allocator is cold), then --calls more calls in the same
  process, the model freed between them: their median is the steady state. Each call runs to
  the weights on cuda:0 after torch.cuda.synchronize() (device_map="cuda:0", dtype=bfloat16);
  peak GPU memory is torch.cuda.max_memory_allocated() over the first call; for ferry, when its
  reads started and when transformers asked for the weights, both from the call.

Prints one JSON line per process (also written to --out) and a table of medians, side by side,
with the ratios ferry/bare and ferry/stock (speeds), then each target of the issues met or
missed. About 8 minutes on the H200 machine.

With FERRY_TF_PROFILE=PREFIX in the environment, each process also profiles its first call with
cProfile (the calling thread only: ferry's reads run in C++ threads, which it does not see) and
writes the 30 functions of most cumulative and most own time to PREFIX.<way>.txt: where the
first call's time beyond the read goes.
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
CALLS = 4
WAYS = ("stock", "ferry", "bare")


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


def case(path: str, how: str, calls: int) -> Dict[str, Any]:
    """One fresh process: `how` ("stock", "ferry" or "bare") called 1 + `calls` times."""
    start = time.perf_counter()
    import gc
    import torch
    import transformers
    import ferry
    import ferry.transformers as ft
    imports = time.perf_counter() - start
    t = time.perf_counter()
    torch.empty(1, device="cuda:0")
    torch.cuda.synchronize()
    cuda_init = time.perf_counter() - t
    if how == "ferry":
        ft.enable()
    # transformers imports its auto classes' module when the attribute is first looked up, and
    # with it generation's (sklearn and scipy where installed: 0.5 s and more on the H100), before
    # from_pretrained is entered: an import of the process, timed apart like the ones above.
    t = time.perf_counter()
    auto_class = transformers.AutoModelForCausalLM
    auto_class_s = time.perf_counter() - t

    def once() -> Any:
        if how == "bare":
            return ferry.load_checkpoint(path, device="cuda:0")
        return auto_class.from_pretrained(path, device_map="cuda:0", dtype=torch.bfloat16)

    seconds, reports = [], []
    out: Dict[str, Any] = {"kind": "case", "how": how, "imports_s": imports,
                           "cuda_init_s": cuda_init, "auto_class_s": auto_class_s}
    profile_to = os.environ.get("FERRY_TF_PROFILE")
    for n in range(1 + calls):
        torch.cuda.reset_peak_memory_stats()
        profiler = None
        if n == 0 and profile_to:
            import cProfile
            profiler = cProfile.Profile()
            profiler.enable()
        t = time.perf_counter()
        loaded = once()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t)
        if profiler is not None:
            profiler.disable()
            import io
            import pstats
            text = io.StringIO()
            for key in ("cumulative", "tottime"):
                pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(30)
            with open(f"{profile_to}.{how}.txt", "w") as f:
                f.write(f"first call {seconds[0]:.3f} s\n" + text.getvalue())
        if n == 0:
            out["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
            tensors = loaded.values() if how == "bare" else loaded.parameters()
            out["model_bytes"] = sum(p.numel() * p.element_size() for p in tensors)
        report = ft.last_load_report() if how == "ferry" else None
        if report is not None:
            reports.append({"taken": report.taken, "early": report.early,
                            "read_started_s": report.read_started_s,
                            "model_built_s": report.model_built_s,
                            "waited_s": report.waited_seconds, "read_s": report.read_seconds,
                            "weight_load_s": report.load_seconds})
        del loaded
        gc.collect()
    out.update(first_s=seconds[0], steady_s=statistics.median(seconds[1:]) if calls else None,
               calls_s=seconds)
    if reports:
        out.update(first_report=reports[0], taken=reports[0]["taken"],
                   all_ferry=all(r["taken"] == "ferry" for r in reports))
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
    parser.add_argument("--calls", type=int, default=CALLS,
                        help="calls after the first in each process (the steady state)")
    parser.add_argument("--child", nargs=3, metavar=("WHAT", "NAME", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, name, path = args.child
        result = (make(name, path) if what == "make" else verify(path) if what == "verify"
                  else case(path, what, args.calls))
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
        rows: Dict[str, List[Dict[str, Any]]] = {how: [] for how in WAYS}
        for r in range(args.rounds):
            for how in WAYS:
                result = child(["--child", how, name, path, "--calls", str(args.calls)], env)
                result.update(model=name, round=r, checkpoint_bytes=nbytes, shards=len(files))
                emit(result)
                rows[how].append(result)
        summary.append((name, nbytes, len(files), check, rows))

    print()
    head = ("model", "GiB", "shards", "call", "stock s (GB/s)", "ferry s (GB/s)",
            "bare s (GB/s)", "ferry/bare", "ferry/stock", "ferry reads start / model built s",
            "ferry waited s", "peak GPU ferry/stock", "identical")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    verdicts = []
    for name, nbytes, n, check, rows in summary:
        identical = (check["taken"] == "ferry" and not check["unequal"] and check["same_keys"]
                     and check["ties_equal"] and check["logits_equal"])
        served = all(r.get("all_ferry") for r in rows["ferry"])
        peak = median(rows["ferry"], "peak_gpu_bytes") / median(rows["stock"], "peak_gpu_bytes")
        early = [r["first_report"] for r in rows["ferry"]]
        for call in ("first", "steady"):
            if call == "steady" and not args.calls:
                continue
            t = {how: median(rows[how], f"{call}_s") for how in WAYS}

            def cell(how: str) -> str:
                return f"{t[how]:.3f} ({nbytes / t[how] / 1e9:.1f})"

            timing = (f"{statistics.median(e['read_started_s'] or 0 for e in early):.3f} / "
                      f"{statistics.median(e['model_built_s'] or 0 for e in early):.3f}"
                      if call == "first" else "")
            waited = (f"{statistics.median(e['waited_s'] for e in early):.3f}"
                      if call == "first" else "")
            print(" | ".join([
                name, f"{nbytes / GIB:.2f}", str(n), call, cell("stock"), cell("ferry"),
                cell("bare"), f"{t['bare'] / t['ferry']:.2f}x", f"{t['stock'] / t['ferry']:.2f}x",
                timing, waited, f"{peak:.3f}" if call == "first" else "",
                "yes" if identical and served else "NO"]))
            if call == "steady":
                verdicts.append((f"{name}: ferry's from_pretrained in steady state >= 0.9x the "
                                 f"bare load", t["bare"] / t["ferry"] >= 0.9))
            elif nbytes >= 12 * GIB:
                verdicts.append((f"{name}: the first call in a process >= 30 GB/s",
                                 nbytes / t["ferry"] / 1e9 >= 30))
        verdicts.append((f"{name}: identical to stock, every file read by ferry",
                         identical and served))
        verdicts.append((f"{name}: the reads started before the model was built",
                         all(e["early"] == "started before the model was built" for e in early)))
        verdicts.append((f"{name}: peak GPU memory <= 1.1x stock", peak <= 1.1))
    print()
    for text, ok in verdicts:
        print(f"{'met   ' if ok else 'MISSED'} {text}")
    if out:
        out.close()


if __name__ == "__main__":
    main()
