"""Host loads by residency (issue 48, bench/NOTES.md §31): ferry's mapped route, its read route,
its default (auto) and safetensors.torch.load_file, each in a fresh process, rounds alternating
the order, on one safetensors file resident in the page cache and dropped from it (fdatasync +
posix_fadvise DONTNEED before each cold run). Two times per run: until load_file returns, and
until every page of every tensor has been read (one byte per 4 KiB page, so a lazy mapping
faults its pages in; memory a read filled is only read back).

    python bench/host_map_bench.py DIR [--size-mib 2048] [--rounds 5] [--states resident,cold]

The file (DIR/model.safetensors: BF16 layers of 4 matrices and 2 vectors each, about the given
size) is made when DIR lacks it. safetensors is imported where installed; else its column is
skipped, saying so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import struct
import subprocess
import sys

CHILD = r"""
import json, os, sys, time
case, path = sys.argv[1], sys.argv[2]
if case.startswith("ferry "):
    os.environ["FERRY_HOST_LOAD"] = case.split()[1]  # auto, map or read
import torch
if case == "safetensors":
    from safetensors.torch import load_file
else:
    import ferry
    from ferry.safetensors.torch import load_file
t0 = time.perf_counter()
tensors = load_file(path)
t1 = time.perf_counter()
seen = 0
for t in tensors.values():
    flat = t.reshape(-1).view(torch.uint8)
    if flat.numel():
        seen += int(flat[::4096].sum())
t2 = time.perf_counter()
route = "" if case == "safetensors" else ",".join(r.path for r in
                                                  ferry.last_load_report().host_routes)
print(json.dumps({"return_s": t1 - t0, "touch_s": t2 - t0, "route": route,
                  "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                  "checksum": seen}))
"""


def make(path: str, size_mib: int) -> None:
    """BF16 layers (q and o h x h, gate and up 4h x h, two norms) up to `size_mib`, one file."""
    import numpy as np
    h = 1024 if size_mib < 1024 else 4096
    layer = (h * h * 2 + 2 * h * 4 * h + h) * 2  # q, o; gate, up as (4h, h); two norms
    layers = max(1, (size_mib << 20) // layer)
    header, off = {}, 0
    for i in range(layers):
        for name, shape in [("q", (h, h)), ("o", (h, h)), ("gate", (4 * h, h)),
                            ("up", (4 * h, h)), ("norm1", (h // 2,)), ("norm2", (h // 2,))]:
            n = int(np.prod(shape)) * 2
            header[f"layers.{i}.{name}"] = {"dtype": "BF16", "shape": list(shape),
                                            "data_offsets": [off, off + n]}
            off += n
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    chunk = np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        left = off
        while left:
            f.write(chunk[:min(left, len(chunk))])
            left -= min(left, len(chunk))


def set_state(path: str, state: str) -> float:
    """Makes the file resident or cold; returns the fraction resident afterwards."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if state == "cold":
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        else:
            while os.read(fd, 64 << 20):
                pass
    finally:
        os.close(fd)
    import ferry
    return ferry.page_cache_residency(path).fraction


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--states", default="resident,cold")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    path = os.path.join(a.dir, "model.safetensors")
    if not os.path.exists(path):
        make(path, a.size_mib)
    cases = ["ferry auto", "ferry map", "ferry read", "safetensors"]
    if importlib.util.find_spec("safetensors") is None:
        print("safetensors column skipped: safetensors is not installed here "
              "(pip install safetensors to compare)", flush=True)
        cases.remove("safetensors")
    rows = []
    for state in a.states.split(","):
        for r in range(a.rounds):
            for case in cases if r % 2 == 0 else cases[::-1]:
                resident = set_state(path, state)
                out = subprocess.run([sys.executable, "-c", CHILD, case, path],
                                     capture_output=True, text=True)
                row = ({"error": out.stderr.strip()[-300:]} if out.returncode else
                       json.loads(out.stdout.strip().splitlines()[-1]))
                row.update({"case": case, "state": state, "round": r,
                            "resident_before": round(resident, 3)})
                rows.append(row)
                print(json.dumps(row), flush=True)
    base = "safetensors" if "safetensors" in cases else "ferry read"
    for state in a.states.split(","):
        med = {}
        for case in cases:
            rs = [x for x in rows if x["case"] == case and x["state"] == state and "touch_s" in x]
            if rs:
                med[case] = (statistics.median(x["return_s"] for x in rs),
                             statistics.median(x["touch_s"] for x in rs), rs[0]["route"],
                             rs[0]["bytes"], len(rs))
        for case, (ret, touch, route, n, count) in med.items():
            vs = ""
            if base in med and case != base:  # > 1: faster than the base
                vs = (f"  vs {base}: return {med[base][0] / ret:.2f}x, "
                      f"touch {med[base][1] / touch:.2f}x")
            print(f"{state:9} {case:12} return {ret:.4f} s, touched {touch:.4f} s "
                  f"({n / touch / 1e9:.2f} GB/s) route {route or '-'}, n={count}{vs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
