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

--checkpoint "3000x16KiB,300x4MiB" (issue 48) measures checkpoints instead: for each shape, one
model.safetensors of N tensors of SIZE served by nginx (its access log counting the requests)
and by s3rver (scripts/install-s3rver, read through s3:// and SigV4), both started here on
127.0.0.1. Per server, interleaved over --rounds rounds: ferry.load_checkpoint into host memory
(a fresh process: --repeat loads, the first and the warm median), and parallel curl reading the
same file whole in task_size ranges at ferry's worker count, the bytes thrown away (the
ceiling) and landed in memory. Reported: GETs per load (the load report's, and nginx's count)
against ceil(bytes / task_size) + 3, and ferry / parallel curl; and per case, the counts that a
loaded machine cannot fake: the server process's CPU-seconds per GB served (/proc/PID/stat), the
client's (its rusage), and the client's page faults per load. --ferry-before DIR adds the
case "ferry_before": the same loads by another build's Python package (DIR holds its `ferry`
folder), run beside this tree's in each round, the two in alternating order. --servers picks
nginx, s3rver or both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
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


_LOAD = r"""
import json, sys, time
import ferry
url, repeat = sys.argv[1], int(sys.argv[2])
times, reports = [], []
for _ in range(repeat):
    t0 = time.perf_counter()
    ferry.load_checkpoint(url, framework="numpy")
    times.append(time.perf_counter() - t0)
    r = ferry.last_load_report()
    reports.append({"gets": r.gets, "retries": r.retries, "connections": r.connections,
                    "bytes": r.bytes,
                    "workers": max((x.workers for x in r.routes), default=0)})
print(json.dumps({"times": times, "reports": reports}))
"""


def write_checkpoint(path: Path, count: int, size: int) -> int:
    """A model.safetensors of `count` U8 tensors of `size` bytes; returns the file's size."""
    header, at = {}, 0
    for i in range(count):
        header[f"layers.{i:05d}.weight"] = {"dtype": "U8", "shape": [size],
                                            "data_offsets": [at, at + size]}
        at += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for done in range(0, at, len(chunk)):
            f.write(chunk[: min(len(chunk), at - done)])
    return 8 + len(text) + at


@contextmanager
def checkpoint_servers(root: Path, name: str, which: str = "nginx,s3rver"):
    """Yields [(server, url for ferry, plain http URL for curl, env, access log or None)]."""
    sys.path.insert(0, str(REPO / "tests" / "python"))
    import remote_servers as rs
    with contextlib.ExitStack() as stack:
        out = []
        log = root.parent / f"{root.name}-access.log"
        if "nginx" in which:
            base = stack.enter_context(rs.nginx_server(root, access_log=log))
            out.append(("nginx", f"{base}/{name}", f"{base}/{name}", {}, log))
        try:
            if "s3rver" not in which:
                raise rs.ServerUnavailable("not asked for (--servers)")
            s3dir = Path(tempfile.mkdtemp(prefix="ferry-bench-s3-", dir=root.parent))
            endpoint, key, secret = stack.enter_context(rs.s3rver_server(s3dir))
            s3 = rs.S3Server(endpoint, key, secret, s3dir)
            s3.create_bucket("bench")
            rs.s3_put(endpoint, "bench", name, (root / name).read_bytes(), key, secret)
            out.append(("s3rver", f"s3://bench/{name}", s3.url("bench", name), s3.env(), None))
        except rs.ServerUnavailable as e:
            print(f"remote_bench: s3rver skipped: {e}", flush=True)
        yield out


def checkpoint_main(a: argparse.Namespace) -> int:
    bench = Path(a.build) / "bench" / "ferry_remote_bench"
    task = 4 << 20  # the default task_size
    summary: list[dict] = []
    out = open(a.out, "w") if a.out else None
    for shape in a.checkpoint.split(","):
        count, size = shape.lower().split("x")
        count, size = int(count), parse_size(size)
        with tempfile.TemporaryDirectory(dir=a.dir, prefix="ferry-ckpt-bench-") as tmp:
            root = Path(tmp) / "root"
            root.mkdir()
            name = "model.safetensors"
            total = write_checkpoint(root / name, count, size)
            bound = math.ceil(count * size / task) + 3
            with checkpoint_servers(root, name, a.servers) as servers:
                for server_name, url, plain, env, log in servers:
                    rows: dict[str, list] = {"ferry": [], "curl": [], "curl_memory": [],
                                             "local": []}
                    gets, seen = [], []
                    workers = 0
                    # The server's CPU and the client's, per GB moved, and the client's page
                    # faults per load: counts a loaded machine cannot fake, unlike the rates.
                    costs: dict[str, list] = {"ferry": [], "curl": [], "curl_memory": []}
                    builds = [("ferry", str(REPO / "python"))]
                    if a.ferry_before:
                        builds.append(("ferry_before", a.ferry_before))
                        rows["ferry_before"], costs["ferry_before"] = [], []
                    server_pid = _listening_pid(plain)
                    for rnd in range(a.rounds + 1):  # round 0 warms the server up
                        for case, pythonpath in builds[rnd % 2:] + builds[:rnd % 2]:
                            before = len(_requests(log))
                            r, cost = _costed(server_pid, lambda: subprocess.run(
                                [sys.executable, "-c", _LOAD, url, str(a.repeat)], text=True,
                                capture_output=True, timeout=600,
                                env={**os.environ, **env, "PYTHONPATH": pythonpath}))
                            if r.returncode != 0:
                                raise RuntimeError(f"{case} load of {url}: {r.stderr.strip()}")
                            got = json.loads(r.stdout)
                            workers = got["reports"][-1]["workers"]
                            if rnd == 0:
                                continue
                            rows[case].append(
                                (total / got["times"][0] / 1e9,
                                 total / statistics.median(got["times"][1:] or got["times"]) / 1e9))
                            costs[case].append(_per_load(cost, total, a.repeat))
                            if case != "ferry":
                                continue
                            # Requests per load from the server's side: the open's HEAD and
                            # header GET come once per process, in the first load.
                            seen.append((len(_requests(log)) - before) if log else None)
                            gets.append(got["reports"][-1]["gets"])
                        if rnd == 0:
                            continue
                        # The same loader on the same file from local tmpfs: what the loader's
                        # own per-tensor work (allocations, page faults) allows.
                        r = subprocess.run([sys.executable, "-c", _LOAD, str(root / name),
                                            str(a.repeat)], text=True, capture_output=True,
                                           timeout=600,
                                           env={**os.environ, "PYTHONPATH": str(REPO / "python")})
                        t = json.loads(r.stdout)["times"]
                        rows["local"].append((total / t[0] / 1e9,
                                              total / statistics.median(t[1:] or t) / 1e9))
                        for case, label in (("curl_parallel", "curl"),
                                            ("curl_memory", "curl_memory")):
                            c, cost = _costed(server_pid, lambda: subprocess.run(
                                [str(bench), "--url", plain, "--case", case, "--repeat",
                                 str(a.repeat), "--size", str(total), "--threads", str(workers),
                                 "--task-size", str(task)],
                                capture_output=True, text=True, timeout=600))
                            costs[label].append(_per_load(cost, total, a.repeat + 1))
                            if c.returncode != 0:
                                raise RuntimeError(f"{case} {plain}: {c.stderr.strip()}")
                            row = json.loads(c.stdout)
                            rows[label].append((row["first_gbps"], row["warm_median_gbps"]))
                    med = {k: (statistics.median(v[0] for v in rows[k]),
                               statistics.median(v[1] for v in rows[k])) for k in rows}
                    line = {"shape": shape, "server": server_name, "bytes": total,
                            "workers": workers, "gets_per_load": statistics.median(gets),
                            "server_requests_per_process": seen[0] if log else None,
                            "bound": bound,
                            "ferry_gbps": med["ferry"], "curl_gbps": med["curl"],
                            "curl_memory_gbps": med["curl_memory"],
                            "local_load_gbps": med["local"],
                            "ferry_before_gbps": med.get("ferry_before"),
                            "ratio_to_curl": med["ferry"][1] / med["curl"][1],
                            "ratio_to_curl_memory": med["ferry"][1] / med["curl_memory"][1],
                            "costs": {k: {m: statistics.median(c[m] for c in v) for m in v[0]}
                                      for k, v in costs.items() if v}}
                    summary.append(line)
                    if out:
                        out.write(json.dumps(line) + "\n")
                    print(f"{shape:>12} {server_name:7s} {statistics.median(gets):6.0f} GETs/load "
                          f"(bound {bound}; server saw {seen[0] if log else '-'} requests in the "
                          f"first process's {a.repeat} loads)  ferry warm {med['ferry'][1]:.2f} "
                          f"GB/s (first {med['ferry'][0]:.2f}), curl {med['curl'][1]:.2f}, curl "
                          f"into memory {med['curl_memory'][1]:.2f}: {line['ratio_to_curl']:.2f}x "
                          f"curl, {line['ratio_to_curl_memory']:.2f}x curl into memory "
                          f"({'meets' if line['ratio_to_curl'] >= 0.9 else 'MISSES'} 0.9x); the same load "
                          f"from local tmpfs {med['local'][1]:.2f} GB/s"
                          + (f"; --ferry-before's build warm {med['ferry_before'][1]:.2f} GB/s "
                             f"({med['ferry_before'][1] / med['curl'][1]:.2f}x curl)"
                             if "ferry_before" in med else ""),
                          flush=True)
                    for k, c in line["costs"].items():
                        print(f"{'':>12} {k:12s} server {c['server_cpu_s_per_gb']:.2f} CPU-s/GB, "
                              f"client {c['client_cpu_s_per_gb']:.2f} CPU-s/GB, "
                              f"{c['client_faults_per_load']:.0f} page faults a load", flush=True)
    return 0


def _listening_pid(url: str) -> int | None:
    """The process listening on url's port on this machine, or None: the listening socket's
    inode in /proc/net/tcp, then the process holding it among /proc/*/fd (no `ss` needed: the
    GPU machine has no iproute2)."""
    port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[-1])
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{f[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:
            continue
    return None


def _process_cpu(pid: int | None) -> float:
    if pid is None:
        return math.nan
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _costed(server_pid: int | None, run):
    """run()'s result and (client CPU-s, client page faults, server CPU-s) while it ran; the
    client is the child process run() waited for."""
    before, server = resource.getrusage(resource.RUSAGE_CHILDREN), _process_cpu(server_pid)
    result = run()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return result, (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                    after.ru_minflt - before.ru_minflt, _process_cpu(server_pid) - server)


def _per_load(cost: tuple, total: int, loads: int) -> dict:
    client, faults, server = cost
    gb = total * loads / 1e9
    return {"server_cpu_s_per_gb": server / gb, "client_cpu_s_per_gb": client / gb,
            "client_faults_per_load": faults / loads}


def _requests(log: Path | None) -> list[str]:
    if log is None or not log.exists():
        return []
    return [x for x in log.read_text().splitlines() if ".ferry-nginx-ready" not in x]


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
    p.add_argument("--ferry-before", help="--checkpoint: another build's python/ folder, loaded "
                   "beside this tree's in each round (case ferry_before)")
    p.add_argument("--servers", default="nginx,s3rver", help="--checkpoint: nginx, s3rver or both")
    p.add_argument("--gpu", choices=["auto", "yes", "no"], default="auto")
    p.add_argument("--out", help="also write every run as a JSON line here")
    p.add_argument("--checkpoint", help='checkpoint shapes, e.g. "3000x16KiB,300x4MiB" '
                                        "(issue 48: GETs per load and ferry / parallel curl)")
    a = p.parse_args()
    if a.checkpoint:
        return checkpoint_main(a)
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
