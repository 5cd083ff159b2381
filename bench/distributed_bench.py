#!/usr/bin/env python3
"""Many GPUs (issue 13): several GPUs in one process, and checkpoints loaded across ranks.

    PYTHONPATH=python python3 bench/distributed_bench.py OUT_DIR               # 2-GPU machine
    PYTHONPATH=python python3 bench/distributed_bench.py OUT_DIR --parts a     # one part only
    PYTHONPATH=python python3 bench/distributed_bench.py OUT_DIR --tiny        # logic, any box

Every case runs in fresh processes, hot (pages cached) and cold (fsync + posix_fadvise
DONTNEED on every file first; the residency left is measured with mincore and printed):

(a) several GPUs in one process: one 16 GiB file; GPU 0 alone reads its first 8 GiB, then the
    two GPUs read 8 GiB each at once (ferry.distributed.read_split), in the same process, so the
    ratio of the two rates is measured in one run. Three ways: "python-default" (ferry's default
    pool, as a program that never heard of prepare_devices gets it), "python-prepared"
    (prepare_devices: the pool sized for both GPUs, staging made per GPU), "cli" (ferry read
    --gpu 0 --size 8GiB against ferry read --gpu 0,1, where each GPU has a runtime of its own).
(b) replicated load on every GPU (one rank per GPU, torchrun, NCCL): ferry.distributed's
    load_checkpoint (each byte read once, then broadcast) against every rank reading the whole
    checkpoint itself with ferry.load_checkpoint, and with safetensors.torch.load_file.
(c) sharded load: a plan on half the tensors (dimension 0 and 1 alternately), every rank's
    slice checked torch.equal to tensor_split of the full tensor from safetensors' own load.

The checkpoint is bench/checkpoint_bench.py's synthetic one (16 GiB in 4 shards, 480 tensors),
made once in FERRY_BENCH_DIR (default build-bench-ckpt/, shared with that bench). Each result
states the bytes read from storage: ferry's own count (its reports) and the kernel's
(/proc/self/io read_bytes: what reached the block device, summed over the ranks). Times run from
a barrier before the load to every rank's tensors usable (synchronized) and a barrier after.
Writes OUT_DIR/distributed_bench.jsonl and distributed_bench.txt. NVLink multicast stays off in
every process started (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import checkpoint_bench as cb  # noqa: E402  (the synthetic checkpoint, its reader)
import page_cache  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}


def proc_io() -> Dict[str, int]:
    out = {}
    try:
        for line in open("/proc/self/io"):
            k, v = line.split(":")
            out[k.strip()] = int(v)
    except OSError:
        pass
    return out


def io_delta(before: Dict[str, int]) -> Dict[str, int]:
    after = proc_io()
    return {k: after.get(k, 0) - before.get(k, 0) for k in ("rchar", "read_bytes")}


# ----------------------------------------------------------------------------- (a) one process


def make_raw(path: str, size: int) -> None:
    """`size` bytes of incompressible data, written once (a DONE size check)."""
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    block = os.urandom(64 * MIB)
    with open(path, "wb") as f:
        written = 0
        i = 0
        while written < size:
            n = min(len(block), size - written)
            f.write(block[:n] if i % 2 == 0 else block[n - 1::-1][:n])
            written += n
            i += 1
        f.flush()
        os.fsync(f.fileno())


def one_process_case(variant: str, path: str, half: int, cold: bool, gpus: int) -> Dict[str, Any]:
    """GPU 0 alone on [0, half), then GPUs 0..gpus-1 on [0, gpus*half) at once: one process."""
    import torch
    import ferry
    import ferry.distributed as fd
    devices = list(range(gpus))
    for d in devices:
        torch.empty(1, device=f"cuda:{d}")  # contexts out of the timing
    if variant == "python-prepared":
        fd.prepare_devices(devices)
    else:  # a first small read per GPU, as any program makes: the default pool as it grows
        for d in devices:
            with ferry.open(path) as f:
                f.read(torch.empty(64 * MIB, dtype=torch.uint8, device=f"cuda:{d}"))
    result: Dict[str, Any] = {"variant": variant}
    if cold:
        result["resident_single"] = page_cache.drop_pages([path])
    buf = torch.empty(half, dtype=torch.uint8, device="cuda:0")
    io0 = proc_io()
    start = time.perf_counter()
    with ferry.open(path) as f:
        got = f.read(buf, half, 0)
        route = f.last_route
    single = time.perf_counter() - start
    del buf
    result["single"] = {"bytes": got, "seconds": single, "gbps": got / single / 1e9,
                        "route": route.verdict, "io": io_delta(io0)}
    if cold:
        result["resident_split"] = page_cache.drop_pages([path])
    io0 = proc_io()
    split = fd.read_split(path, devices, 0, half * gpus, prepare=variant == "python-prepared")
    result["split"] = {"bytes": split.bytes, "seconds": split.wall, "gbps": split.gbps,
                       "per_gpu_gbps": [n / s / 1e9 for (_, n), s in zip(split.parts,
                                                                          split.seconds)],
                       "routes": [r.verdict for r in split.routes], "io": io_delta(io0),
                       "summary": split.summary()}
    result["ratio"] = result["split"]["gbps"] / result["single"]["gbps"]
    return result


def cli_case(path: str, half: int, cold: bool, gpus: int, env: Dict[str, str]) -> Dict[str, Any]:
    cli = os.environ.get("FERRY_CLI") or os.path.join(REPO, "build", "tools", "ferry")
    result: Dict[str, Any] = {"variant": "cli"}

    def run(args: List[str]) -> Dict[str, Any]:
        if cold:
            page_cache.drop_pages([path])
        p = subprocess.run([cli, "read", path, "--json"] + args, env=env, capture_output=True,
                           text=True)
        if p.returncode != 0:
            raise RuntimeError(p.stderr[-2000:])
        return json.loads(p.stdout)

    # Hot: the better of two reads in the process (the first pays for the runtimes' threads and
    # staging); cold: one read, its pages dropped just before.
    repeat = ["--repeat", "1" if cold else "2"]
    one = run(["--gpu", "0", "--size", str(half)] + repeat)
    several = run(["--gpu", ",".join(str(d) for d in range(gpus)), "--size", str(half * gpus)]
                  + repeat)
    best = max(range(len(several["runs"])), key=lambda i: several["runs"][i]["gbps"])
    result["single"] = {"bytes": one["bytes"], "gbps": one["best_gbps"],
                        "seconds": one["bytes"] / one["best_gbps"] / 1e9,
                        "route": one["route"].get("op", "")}
    result["split"] = {"bytes": several["bytes"], "gbps": several["best_gbps"],
                       "seconds": several["runs"][best]["seconds"],
                       "per_gpu_gbps": [p["gbps"] for p in several["runs"][best]["parts"]]}
    result["ratio"] = result["split"]["gbps"] / result["single"]["gbps"]
    return result


# ----------------------------------------------------------------------------- (b), (c) ranks


def shard_plan(ckpt: str) -> Dict[str, int]:
    """Half the tensors that can be split: every other one, dimension 0 and 1 alternately
    (1 only for 2-D tensors)."""
    from ferry.checkpoint import Checkpoint
    entries = [e for e in Checkpoint(ckpt).entries.values() if e.shape and e.nbytes]
    plan = {}
    for k, e in enumerate(entries[::2]):
        plan[e.name] = 1 if (k % 2 and len(e.shape) >= 2) else 0
    return plan


def rank_main(case: str, ckpt: str, out: str, verify: bool) -> None:
    """One rank under torchrun: the load, timed between barriers; rank 0 writes everyone's."""
    import datetime
    import torch
    import torch.distributed as dist
    import ferry
    import ferry.distributed as fd
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{local}" if cuda else "cpu"

    def barrier() -> None:
        if cuda:
            dist.barrier(device_ids=[local])
            torch.cuda.synchronize()
        else:
            dist.barrier()

    if cuda:
        torch.empty(1, device=device)
    plan = shard_plan(ckpt) if case == "ferry-sharded" else None
    barrier()
    io0 = proc_io()
    start = time.perf_counter()
    report = None
    if case == "ferry-distributed":
        tensors = fd.load_checkpoint(ckpt, device=device)
        report = fd.last_load_report()
    elif case == "ferry-sharded":
        tensors = fd.load_checkpoint(ckpt, device=device, plan=plan)
        report = fd.last_load_report()
    elif case == "ferry-each":
        tensors = ferry.load_checkpoint(ckpt, device=device)
    elif case == "safetensors-each":
        tensors = {}
        for f in cb.shard_files(ckpt):
            tensors.update(cb.st_load_file(f, device))
    else:
        raise SystemExit(f"unknown case {case}")
    if cuda:
        torch.cuda.synchronize()
    mine = time.perf_counter() - start
    barrier()
    wall = time.perf_counter() - start
    io = io_delta(io0)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    me: Dict[str, Any] = {"rank": rank, "seconds": mine, "wall": wall, "io": io,
                          "tensor_bytes": nbytes}
    if case == "ferry-each":
        me["ferry_bytes_read"] = ferry.last_load_report().bytes
    if verify and case.startswith("ferry"):
        me["check"] = check(torch, tensors, ckpt, device, plan, rank, world)
    everyone: List[Any] = [None] * world
    dist.all_gather_object(everyone, me)
    if rank == 0:
        result: Dict[str, Any] = {"case": case, "world": world, "ranks": everyone,
                                  "wall": max(r["wall"] for r in everyone),
                                  "read_bytes": sum(r["io"]["read_bytes"] for r in everyone),
                                  "rchar": sum(r["io"]["rchar"] for r in everyone)}
        if report is not None:
            result["report"] = report.to_dict()
            result["summary"] = report.summary()
            result["ferry_bytes_read"] = report.bytes_read
            result["checkpoint_bytes"] = report.checkpoint_bytes
            result["exchange_payload_bytes"] = report.exchange_payload_bytes
            result["exchange_delivered_bytes"] = report.exchange_delivered_bytes
        elif case == "ferry-each":
            result["ferry_bytes_read"] = sum(r["ferry_bytes_read"] for r in everyone)
        json.dump(result, open(out, "w"))
    dist.destroy_process_group()


def check(torch: Any, got: Dict[str, Any], ckpt: str, device: str, plan: Optional[Dict[str, int]],
          rank: int, world: int) -> Dict[str, Any]:
    """Every tensor (or this rank's slice of it) torch.equal to safetensors' load of the full
    tensor, shard by shard."""
    checked, bad, sliced = 0, [], 0
    for f in cb.shard_files(ckpt):
        for name, full in cb.st_load_file(f, device).items():
            want = full
            if plan and name in plan:
                want = torch.tensor_split(full, world, dim=plan[name])[rank]
                sliced += 1
            mine = got.get(name)
            ok = (mine is not None and mine.dtype == want.dtype and mine.shape == want.shape and
                  torch.equal(cb.comparable(torch, mine), cb.comparable(torch, want)))
            checked += 1
            if not ok:
                bad.append(name)
    return {"checked": checked, "sliced": sliced, "mismatched": bad[:10], "equal": not bad and
            checked == len(got)}


# ----------------------------------------------------------------------------- driver


def torchrun_works() -> bool:
    """Debian's torch 1.13 torchrun fails on Python 3.11 before starting a worker (its Std
    flags lost the NONE member to 3.11's enum changes); there the bench starts the ranks itself,
    with the environment torchrun would give them."""
    import torch
    return not (torch.__version__.startswith("1.") and sys.version_info >= (3, 11))


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(case: str, ckpt: str, world: int, out: str, verify: bool, env: Dict[str, str],
           launcher: str) -> Dict[str, Any]:
    args = [os.path.abspath(__file__), "--rank", case, ckpt, out, "1" if verify else "0"]
    if os.path.exists(out):
        os.remove(out)
    if launcher == "torchrun":
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc_per_node={world}"] + args, env=env, capture_output=True,
                           text=True, timeout=900)
        failed = p.returncode != 0
        text = (p.stderr or p.stdout)[-3000:]
    else:
        base = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                    WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
        procs = [subprocess.Popen([sys.executable] + args, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  env=dict(base, RANK=str(r), LOCAL_RANK=str(r)))
                 for r in range(world)]
        texts = [p.communicate(timeout=900)[0] for p in procs]
        failed = any(p.returncode != 0 for p in procs)
        text = "\n".join(t[-1500:] for t in texts)
    if failed or not os.path.exists(out):
        return {"case": case, "error": text, "launcher": launcher}
    result = json.load(open(out))
    result["launcher"] = launcher
    return result


def table(rows: List[Dict[str, Any]]) -> str:
    out = ["(a) one process: GPU 0 alone, then every GPU at once (same process)",
           f"{'variant':<16} {'temp':<5} {'1 GPU GB/s':>10} {'all GB/s':>9} {'ratio':>6}  "
           f"per GPU GB/s   storage bytes (1 GPU / all)"]
    for r in rows:
        if r.get("part") != "a":
            continue
        if "error" in r:
            out.append(f"{r.get('variant', ''):<16} {r['temperature']:<5} ERROR "
                       f"{r['error'].strip().splitlines()[-1] if r['error'].strip() else ''}")
            continue
        s, m = r["single"], r["split"]
        out.append(f"{r['variant']:<16} {r['temperature']:<5} {s['gbps']:10.2f} {m['gbps']:9.2f} "
                   f"{r['ratio']:6.2f}  {', '.join(f'{g:.1f}' for g in m['per_gpu_gbps']):<14} "
                   f"{s['bytes']} / {m['bytes']} (kernel: {s.get('io', {}).get('read_bytes', '-')}"
                   f" / {m.get('io', {}).get('read_bytes', '-')})")
    out.append("")
    out.append("(b) replicated and (c) sharded loads, one rank per GPU")
    base: Dict[str, float] = {}
    for r in rows:
        if r.get("part") in ("b", "c") and "wall" in r:
            base.setdefault(f"{r['temperature']}:{r['case']}", r["wall"])
    out.append(f"{'case':<18} {'temp':<5} {'ranks':>5} {'wall s':>8} {'GB/s':>7} {'x each':>7} "
               f"{'x st':>6} {'storage B (ferry)':>18} {'kernel read_bytes':>18} "
               f"{'exchanged B':>14}  check")
    for r in rows:
        if r.get("part") not in ("b", "c"):
            continue
        if "error" in r:
            out.append(f"{r['case']:<18} {r['temperature']:<5} ERROR "
                       f"{r['error'].strip().splitlines()[-1] if r['error'].strip() else ''}")
            continue
        t = r["temperature"]
        each = base.get(f"{t}:ferry-each")
        st = base.get(f"{t}:safetensors-each")
        nbytes = r.get("checkpoint_bytes") or r["ranks"][0]["tensor_bytes"]
        checks = [x.get("check") for x in r["ranks"] if x.get("check")]
        verdict = "" if not checks else ("equal" if all(c["equal"] for c in checks)
                                         else "MISMATCH")
        out.append(f"{r['case']:<18} {t:<5} {r['world']:>5} {r['wall']:8.3f} "
                   f"{nbytes / r['wall'] / 1e9:7.2f} "
                   f"{(each / r['wall']) if each else float('nan'):7.2f} "
                   f"{(st / r['wall']) if st else float('nan'):6.2f} "
                   f"{str(r.get('ferry_bytes_read', '-')):>18} {r['read_bytes']:>18} "
                   f"{str(r.get('exchange_payload_bytes', '-')):>14}  {verdict}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--tiny", action="store_true",
                    help="a tiny checkpoint, CPU tensors over gloo where there is no GPU")
    ap.add_argument("--parts", default="abc", help="which parts to run: a, b, c (default abc)")
    ap.add_argument("--no-cold", action="store_true", help="hot page cache only")
    ap.add_argument("--no-verify", action="store_true", help="skip the equality checks")
    ap.add_argument("--ranks", type=int, default=0, help="ranks for (b), (c): default every GPU")
    ap.add_argument("--launcher", choices=("auto", "torchrun", "env"), default="auto",
                    help="how ranks start: torchrun, or env (the same environment, started here)")
    ap.add_argument("--rank", nargs=4, metavar=("CASE", "CKPT", "OUT", "VERIFY"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--one-process", nargs=5, metavar=("VARIANT", "PATH", "HALF", "COLD", "GPUS"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:
        case, ckpt, out, verify = a.rank
        rank_main(case, ckpt, out, verify == "1")
        return 0
    if a.one_process:
        variant, path, half, cold, gpus = a.one_process
        print(json.dumps(one_process_case(variant, path, int(half), cold == "1", int(gpus))))
        return 0
    if not a.out:
        ap.error("name an output folder")
    os.makedirs(a.out, exist_ok=True)
    import ferry.distributed as fd
    gpus = fd.gpu_count()
    env = dict(os.environ, **MULTICAST_OFF)
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    if a.tiny:
        env["FERRY_BENCH_TINY"] = os.environ["FERRY_BENCH_TINY"] = "1"
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.update(MULTICAST_OFF)
    work = os.environ.get("FERRY_BENCH_DIR",
                          os.path.join(REPO, "build-bench-ckpt" + ("-tiny" if a.tiny else "")))
    os.makedirs(work, exist_ok=True)
    t0 = time.perf_counter()
    import torch
    device = "cuda:0" if gpus and torch.cuda.is_available() else "cpu"
    synthetic = os.path.join(work, "synthetic")
    info: Dict[str, Any] = {"gpus": gpus, "torch": torch.__version__, "work_dir": work,
                            "synthetic": cb.make_synthetic(synthetic, a.tiny, device),
                            "multicast_off": MULTICAST_OFF}
    info["fs"] = subprocess.run(["stat", "-f", "-c", "%T", work], capture_output=True,
                                text=True).stdout.strip()
    temps = ["hot"] if a.no_cold else ["hot", "cold"]
    rows: List[Dict[str, Any]] = []
    jsonl = open(os.path.join(a.out, "distributed_bench.jsonl"), "w")

    def emit(r: Dict[str, Any]) -> None:
        rows.append(r)
        jsonl.write(json.dumps(r) + "\n")
        jsonl.flush()
        brief = r.get("ratio", r.get("wall", ""))
        print(f"({r.get('part')}) {r.get('case', r.get('variant'))} {r.get('temperature')}: "
              f"{brief} {r.get('error', '')[-400:]}", flush=True)

    if "a" in a.parts:
        if gpus < 2:
            info["part_a"] = f"skipped: {gpus} GPU(s) here, it needs 2 or more"
        else:
            half = (64 * MIB) if a.tiny else 8 * GIB
            raw = os.path.join(work, "several-gpus.bin")
            make_raw(raw, half * 2)
            for temp in temps:
                for variant in ("python-default", "python-prepared", "cli"):
                    if temp == "hot":
                        page_cache.warm_pages([raw])
                    try:
                        if variant == "cli":
                            r = cli_case(raw, half, temp == "cold", 2, env)
                        else:
                            p = subprocess.run(
                                [sys.executable, os.path.abspath(__file__), "--one-process",
                                 variant, raw, str(half), "1" if temp == "cold" else "0", "2"],
                                env=env, capture_output=True, text=True, timeout=600)
                            lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
                            if p.returncode != 0 or not lines:
                                raise RuntimeError((p.stderr or p.stdout)[-2000:])
                            r = json.loads(lines[-1])
                    except Exception as e:  # one failed case does not stop the others
                        r = {"variant": variant, "error": str(e)}
                    r.update({"part": "a", "temperature": temp})
                    emit(r)
    world = a.ranks or max(gpus, 2)
    launcher = a.launcher if a.launcher != "auto" else ("torchrun" if torchrun_works() else "env")
    info["launcher"] = launcher
    cases = []
    if "b" in a.parts:
        cases += [("b", c) for c in ("ferry-distributed", "ferry-each", "safetensors-each")]
    if "c" in a.parts:
        cases += [("c", "ferry-sharded")]
    shards = cb.shard_files(synthetic)
    for temp in temps:
        for part, case in cases:
            left = page_cache.drop_pages(shards) if temp == "cold" else page_cache.warm_pages(shards)
            verify = not a.no_verify and case.startswith("ferry") and \
                (case == "ferry-sharded" or temp == "hot")
            r = launch(case, synthetic, world, os.path.join(a.out, f"rank-{case}.json"), verify,
                       env, launcher)
            r.update({"part": part, "temperature": temp, "resident_before": left})
            emit(r)
    info["seconds"] = time.perf_counter() - t0
    jsonl.write(json.dumps({"info": info}) + "\n")
    jsonl.close()
    text = json.dumps(info) + "\n\n" + table(rows)
    print(text)
    open(os.path.join(a.out, "distributed_bench.txt"), "w").write(text + "\n")
    ok = all("error" not in r for r in rows)
    for r in rows:
        for x in r.get("ranks", []):
            if x.get("check") and not x["check"]["equal"]:
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
