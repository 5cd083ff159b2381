"""Host loads by residency (issue 48, bench/NOTES.md §31): ferry's mapped route, its read route,
its default (auto: resident files mapped, cold ones mapped and populated) and
safetensors.torch.load_file, each in a fresh process, rounds alternating the order, on one
safetensors file resident in the page cache and dropped from it (fsync + posix_fadvise
DONTNEED before each cold run). Two times per run: until load_file returns, and until every page
of every tensor has been read (one byte per 4 KiB page, so a lazy mapping faults its pages in;
memory a read filled is only read back).

Beside them, on the cold file, the machine's own routes without ferry or torch ("raw", each
until every byte is in memory): 16 threads of O_DIRECT preads of 4 MiB into reused aligned
buffers (the disk's parallel ceiling), the same into one fresh anonymous mapping (what a read
into fresh memory can reach: the kernel zeroes each page first), 16 threads of MADV_WILLNEED +
MADV_POPULATE_READ over a private mapping 4 MiB at a time (the populated route without ferry),
one thread touching a private mapping (safetensors' faults without torch), and one thread of
buffered 4 MiB preads. Where the bytes stay in memory, "touched" adds one read of each page.

Before the rounds, each ferry and safetensors case runs once untimed on the resident file (a
warm-up, printed with round "warm-up" and left out of the summary): the first process of a run
reads torch's and ferry's code from disk inside its timed section, several milliseconds that
would fall on whichever case came first (bench/NOTES.md §47).

    python bench/host_map_bench.py DIR [--size-mib 2048] [--rounds 5] [--states resident,cold]
                                       [--no-raw] [--no-warm-up]

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

from page_cache import drop_pages, warm_pages

RAW = r"""
import ctypes, json, mmap, os, sys, threading, time
case, path = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                      ctypes.c_long]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.pread.restype = ctypes.c_ssize_t
libc.pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
CHUNK, THREADS = 4 << 20, 16
size = os.path.getsize(path)
claimed = iter(range(0, size, CHUNK))
lock = threading.Lock()
def parallel(each):  # each(offset, length) over the file's 4 MiB chunks, from 16 threads
    def work():
        while True:
            with lock:
                off = next(claimed, None)
            if off is None:
                return
            each(off, min(CHUNK, size - off))
    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    [t.start() for t in threads]
    [t.join() for t in threads]
def direct_into(address_of):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    def each(off, n):
        want = (n + 4095) // 4096 * 4096
        if libc.pread(fd, address_of(off), want, off) < n:
            raise OSError(ctypes.get_errno(), f"pread(O_DIRECT) {path} offset={off}")
    parallel(each)
t0 = time.perf_counter()
if case == "raw direct":
    buffers = threading.local()
    def mine(off):
        if not hasattr(buffers, "m"):
            buffers.m = mmap.mmap(-1, CHUNK)
            buffers.at = ctypes.addressof(ctypes.c_char.from_buffer(buffers.m))
        return buffers.at
    direct_into(mine)
elif case == "raw direct fresh":
    base = libc.mmap(None, size + CHUNK, 3, 0x22, -1, 0)  # PROT_READ|WRITE, PRIVATE|ANONYMOUS
    direct_into(lambda off: base + off)
elif case == "raw populate":
    fd = os.open(path, os.O_RDONLY)
    base = libc.mmap(None, size, 3, 0x02, fd, 0)  # MAP_PRIVATE, as ferry maps
    def each(off, n):
        libc.madvise(base + off, n, 3)  # MADV_WILLNEED
        if libc.madvise(base + off, n, 22):  # MADV_POPULATE_READ
            raise OSError(ctypes.get_errno(), f"MADV_POPULATE_READ {path} offset={off}")
    parallel(each)
elif case == "raw mmap touch":
    fd = os.open(path, os.O_RDONLY)
    m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    import numpy
    int(numpy.frombuffer(m, dtype=numpy.uint8)[::4096].sum())
elif case == "raw buffered":
    fd = os.open(path, os.O_RDONLY)
    buf = bytearray(CHUNK)
    off = 0
    while (n := os.preadv(fd, [buf], off)) > 0:
        off += n
t = time.perf_counter() - t0
if case in ("raw direct fresh", "raw populate"):  # then every page read, as the ferry cases do
    import numpy
    int(numpy.ctypeslib.as_array(ctypes.cast(base, ctypes.POINTER(ctypes.c_uint8)),
                                 (size,))[::4096].sum())
print(json.dumps({"return_s": t, "touch_s": time.perf_counter() - t0, "route": "", "bytes": size,
                  "checksum": 0}))
"""

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
routes = [] if case == "safetensors" else ferry.last_load_report().host_routes
print(json.dumps({"return_s": t1 - t0, "touch_s": t2 - t0,
                  "route": ",".join(r.path for r in routes),
                  "reason": "; ".join(r.reason for r in routes),
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
    return drop_pages([path]) if state == "cold" else warm_pages([path])


def run_case(case: str, path: str, raw: bool) -> dict:
    """One case in a fresh process: its row, or {"error": the end of its stderr}."""
    out = subprocess.run([sys.executable, "-c", RAW if raw else CHILD, case, path],
                         capture_output=True, text=True)
    if out.returncode:
        return {"error": out.stderr.strip()[-300:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--states", default="resident,cold")
    ap.add_argument("--no-raw", action="store_true", help="skip the routes without ferry")
    ap.add_argument("--no-warm-up", action="store_true",
                    help="time the first process of the run too (its libraries' first reads)")
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
    raw = [] if a.no_raw else ["raw direct", "raw direct fresh", "raw populate",
                               "raw mmap touch", "raw buffered"]
    for case in [] if a.no_warm_up else cases:
        resident = set_state(path, "resident")
        row = run_case(case, path, False)
        row.update({"case": case, "state": "resident", "round": "warm-up",
                    "resident_before": round(resident, 3)})
        print(json.dumps(row), flush=True)
    rows = []
    for state in a.states.split(","):
        run = cases + (raw if state == "cold" else [])
        for r in range(a.rounds):
            for case in run if r % 2 == 0 else run[::-1]:
                resident = set_state(path, state)
                row = run_case(case, path, case in raw)
                row.update({"case": case, "state": state, "round": r,
                            "resident_before": round(resident, 3)})
                rows.append(row)
                print(json.dumps(row), flush=True)
    base = "safetensors" if "safetensors" in cases else "ferry read"
    for state in a.states.split(","):
        med = {}
        for case in cases + raw:
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
            print(f"{state:9} {case:16} return {ret:.4f} s, touched {touch:.4f} s "
                  f"({n / touch / 1e9:.2f} GB/s) route {route or '-'}, n={count}{vs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
