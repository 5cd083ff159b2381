"""Remote sources (issue 34), side by side in one run against an HTTP server on loopback:

  ferry_host     ferry into pageable host memory (default settings)
  curl_parallel  libcurl range GETs to nowhere at ferry's own concurrency (its `workers`)
  ceiling        the same at 2x that concurrency: what the server and loopback give
  curl_memory    libcurl at ferry's concurrency, each range copied into its place in one host
                 buffer (what a program landing the bytes in memory with libcurl gets)
  ferry_gpu      ferry into GPU 0 (where a GPU is)
  kvikio_loop    4 MiB GETs one at a time through one pinned bounce buffer, each copy waited
                 for (KvikIO's remote design as issue 34 describes it; where a GPU is)

Each case runs in a fresh process (build/bench/ferry_remote_bench), the cases interleaved over
--rounds rounds, the order rotated each round. Reported per case: the first request (for ferry:
open and read in a new process) and the warm rate (median of --repeat), both as medians over
the rounds, and CPU-seconds per GiB; then the ratios issue 34 names. The server is nginx where it
is installed (the CPU machine), else ferry-http-serve (tests/remote, sendfile; the GPU machine),
or --server. Its ceiling is measured, not assumed.

    /usr/bin/python3 bench/remote_bench.py --size 1GiB --out remote.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parse_size(text: str) -> int:
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "b": 1}
    t = text.strip().lower()
    for unit, scale in units.items():
        if t.endswith(unit):
            return int(float(t[: -len(unit)]) * scale)
    return int(t)


@contextmanager
def ferry_http_serve(binary: Path, root: Path):
    port_file = root / ".port"
    proc = subprocess.Popen([str(binary), str(root), "--port-file", str(port_file)],
                            stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{binary} did not start (exit {proc.poll()})")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text().strip()}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


@contextmanager
def server(kind: str, root: Path, build: Path):
    if kind == "auto":
        kind = "nginx" if shutil.which("nginx") or Path("/usr/sbin/nginx").exists() else "ferry"
    if kind == "nginx":
        sys.path.insert(0, str(REPO / "tests" / "python"))
        import remote_servers  # the tests' nginx, one process, Range and keep-alive on
        with remote_servers.nginx_server(root) as url:
            yield "nginx (tests/python/remote_servers.py)", url
    else:
        with ferry_http_serve(build / "tests" / "remote" / "ferry-http-serve", root) as url:
            yield "ferry-http-serve (tests/remote, sendfile)", url


def has_gpu() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="1GiB")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--server", choices=["auto", "nginx", "ferry"], default="auto")
    p.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                   help="where the object lives (tmpfs by default: the server's disk is not "
                        "measured)")
    p.add_argument("--build", default=str(REPO / "build"))
    p.add_argument("--gpu", choices=["auto", "yes", "no"], default="auto")
    p.add_argument("--out", help="also write every run as a JSON line here")
    a = p.parse_args()
    size = parse_size(a.size)
    build = Path(a.build)
    bench = build / "bench" / "ferry_remote_bench"
    gpu = has_gpu() if a.gpu == "auto" else a.gpu == "yes"
    rows: list[dict] = []
    out = open(a.out, "w") if a.out else None

    with tempfile.TemporaryDirectory(dir=a.dir, prefix="ferry-remote-bench-") as tmp:
        root = Path(tmp)
        obj = root / "object.bin"
        with open(obj, "wb") as f:
            chunk = os.urandom(1 << 20)
            for done in range(0, size, len(chunk)):
                f.write(chunk[: min(len(chunk), size - done)])
        with server(a.server, root, build) as (server_name, base):
            url = f"{base}/object.bin"
            print(f"remote_bench: {size} B from {server_name} at {url}; GPU: {gpu}", flush=True)

            def run(case: str, rnd: int, threads: int = 0, label: str | None = None) -> dict:
                cmd = [str(bench), "--url", url, "--case", case, "--repeat", str(a.repeat),
                       "--size", str(size)]
                if threads:
                    cmd += ["--threads", str(threads)]
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                if r.returncode != 0:
                    raise RuntimeError(f"{case}: exit {r.returncode}: {r.stderr.strip()}")
                row = json.loads(r.stdout)
                row.update(label=label or case, round=rnd, server=server_name)
                rows.append(row)
                if out:
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                print(f"  round {rnd} {row['label']}: first {row['first_gbps']:.2f} GB/s, warm "
                      f"{row['warm_median_gbps']:.2f} GB/s, {row['cpu_s_per_gib']:.3f} CPU-s/GiB",
                      flush=True)
                return row

            workers = run("ferry_host", 0)["workers"]  # also round 0: a warm-up of the server
            rows.clear()
            cases = [("ferry_host", 0), ("curl_parallel", workers),
                     ("ceiling", 2 * workers), ("curl_memory", workers)]
            if gpu:
                cases += [("ferry_gpu", 0), ("kvikio_loop", 0)]
            for rnd in range(1, a.rounds + 1):
                turn = cases[rnd % len(cases):] + cases[: rnd % len(cases)]
                for label, threads in turn:
                    case = "curl_parallel" if label == "ceiling" else label
                    run(case, rnd, threads, label)

    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["label"] == label)

    print(f"\nmedians over {a.rounds} rounds ({size} B, ferry's host workers: {workers}):")
    summary = {"size": size, "rounds": a.rounds, "repeat": a.repeat, "workers": workers}
    for label, _ in cases:
        print(f"  {label:14s} first {med(label, 'first_gbps'):6.2f} GB/s   warm "
              f"{med(label, 'warm_median_gbps'):6.2f} GB/s   {med(label, 'cpu_s_per_gib'):.3f} "
              f"CPU-s/GiB")
        summary[label] = {k: med(label, k) for k in ("first_gbps", "warm_median_gbps",
                                                      "cpu_s_per_gib")}

    def ratio(name: str, num: str, den: str, target: float) -> None:
        w = med(num, "warm_median_gbps") / med(den, "warm_median_gbps")
        f = med(num, "first_gbps") / med(den, "first_gbps")
        verdict = "meets" if w >= target else "MISSES"
        print(f"  {name}: warm {w:.2f}x, first request {f:.2f}x (target >= {target}: {verdict})")
        summary[name] = {"warm": w, "first": f, "target": target}

    print("ratios (issue 34):")
    ratio("host / parallel curl", "ferry_host", "curl_parallel", 0.9)
    ratio("host / curl into memory", "ferry_host", "curl_memory", 1.0)
    if gpu:
        ratio("gpu / ferry host", "ferry_gpu", "ferry_host", 0.85)
        ratio("gpu / kvikio-style loop", "ferry_gpu", "kvikio_loop", 1.5)
    if out:
        out.write(json.dumps({"summary": summary}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
