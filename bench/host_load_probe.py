"""Checkpoint loads into host memory, fresh processes, the order alternating: Python's
ferry.load_checkpoint into torch CPU tensors with the huge-page advice (as shipped) and without
it, into NumPy arrays (whose allocator gives the advice itself), and the CLI's `ferry load
--host` (whose Buffer gives it). Also where a Python load's time goes: the reads (the load
report's seconds) and the rest. The checkpoint is a 4 GiB Qwen2-1.5B-like layout of 290 BF16
tensors in two shards, made here when DIR holds none, then read once into the page cache.

    python bench/host_load_probe.py DIR --cli build/tools/ferry [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys

CHILD = r"""
import json, sys, time
t_import = time.perf_counter()
import torch, ferry, ferry.checkpoint as c
t0 = time.perf_counter()
if sys.argv[2] == "torch, no advice":
    c._HUGE_PAGE = 1 << 62
d = ferry.load_checkpoint(sys.argv[1], framework="np" if sys.argv[2] == "numpy" else "pt")
s = time.perf_counter() - t0
n = sum(v.nbytes if hasattr(v, "nbytes") and not hasattr(v, "element_size")
        else v.numel() * v.element_size() for v in d.values())
r = ferry.last_load_report()
print(json.dumps({"seconds": s, "gbps": n / s / 1e9, "reads_seconds": r.seconds,
                  "import_seconds": t0 - t_import}))
"""


def make(directory: str) -> None:
    import numpy as np
    h, inter, kv, layers = 2048, 5504, 256, 24
    shapes = [("model.embed_tokens.weight", (151936 // 2, h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.q_proj.bias", (h,)),
                   (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
                   (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
                   (p + "self_attn.o_proj.weight", (h, h)), (p + "mlp.gate_proj.weight", (inter, h)),
                   (p + "mlp.up_proj.weight", (inter, h)), (p + "mlp.down_proj.weight", (h, inter)),
                   (p + "input_layernorm.weight", (h,)),
                   (p + "post_attention_layernorm.weight", (h,))]
    shapes.append(("model.norm.weight", (h,)))
    os.makedirs(directory, exist_ok=True)
    half, weight_map = len(shapes) // 2, {}
    chunk = np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8).tobytes()
    for k, part in enumerate((shapes[:half], shapes[half:])):
        name = f"model-{k + 1:05d}-of-00002.safetensors"
        header, off = {}, 0
        for t, shape in part:
            n = int(np.prod(shape)) * 2
            header[t] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
            off += n
            weight_map[t] = name
        hb = json.dumps(header).encode()
        hb += b" " * (-len(hb) % 8)
        with open(os.path.join(directory, name), "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb)
            left = off
            while left:
                f.write(chunk[:min(left, len(chunk))])
                left -= min(left, len(chunk))
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def one(case: str, directory: str, cli: str) -> dict:
    if case == "ferry load --host":
        out = subprocess.run([cli, "load", directory, "--host", "--json"], capture_output=True,
                             text=True)
        if out.returncode:
            return {"error": out.stderr.strip()[-300:]}
        d = json.loads(out.stdout)
        return {"seconds": d["seconds"], "gbps": d["gbps"],
                "allocate_seconds": d.get("allocate_seconds", 0.0)}
    out = subprocess.run([sys.executable, "-c", CHILD, directory, case], capture_output=True,
                         text=True)
    if out.returncode:
        return {"error": out.stderr.strip()[-300:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--cli", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.dir, "model.safetensors.index.json")):
        make(a.dir)
    for f in sorted(os.listdir(a.dir)):
        with open(os.path.join(a.dir, f), "rb") as fh:
            while fh.read(64 << 20):
                pass
    cases = ["torch", "torch, no advice", "numpy", "ferry load --host"]
    rows = []
    for r in range(a.rounds):
        for case in cases if r % 2 == 0 else cases[::-1]:
            row = one(case, a.dir, a.cli)
            row.update({"case": case, "round": r})
            rows.append(row)
            print(json.dumps(row), flush=True)
    for case in cases:
        rs = [x for x in rows if x["case"] == case and "gbps" in x]
        if not rs:
            print(f"{case:20} failed")
            continue
        g = [x["gbps"] for x in rs]
        extra = "".join(f", {k} {statistics.median(x[k] for x in rs):.4f}"
                        for k in ("reads_seconds", "import_seconds", "allocate_seconds")
                        if k in rs[0])
        if "reads_seconds" in rs[0]:  # the Checkpoint's opening and the views
            extra += ", outside the reads %.4f" % statistics.median(
                x["seconds"] - x["reads_seconds"] for x in rs)
        print(f"{case:20} median {statistics.median(g):6.2f} GB/s ({min(g):.2f}..{max(g):.2f}, "
              f"n={len(g)}), seconds {statistics.median(x['seconds'] for x in rs):.4f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
