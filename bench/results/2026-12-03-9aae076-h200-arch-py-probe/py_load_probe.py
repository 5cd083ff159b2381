"""Python's checkpoint loads on the GPU machine, fresh processes, the order alternating:
GPU loads of a checkpoint (ferry.load_checkpoint as users call it, the same after ferry.warm_up
before the clock, and the CLI), and host loads with the allocation policy of 0f97bf1 (every
tensor allocated before the first read) against the one before (during the reads).
Usage: py_load_probe.py GPU_CHECKPOINT HOST_CHECKPOINT CLI [ROUNDS]"""
import json, os, statistics, subprocess, sys

GPU = r"""
import json, sys, time, torch
import ferry
torch.zeros(1, device="cuda:0"); torch.cuda.synchronize()
warm = 0.0
if sys.argv[2] == "warm_up first":
    t = time.perf_counter(); ferry.warm_up(0); warm = time.perf_counter() - t
t0 = time.perf_counter()
d = ferry.load_checkpoint(sys.argv[1], device="cuda:0")
torch.cuda.synchronize()
s = time.perf_counter() - t0
n = sum(v.numel() * v.element_size() for v in d.values())
r = ferry.last_load_report()
print(json.dumps({"seconds": s, "gbps": n / s / 1e9, "reads_seconds": r.seconds,
                  "warm_up_seconds": warm}))
"""
HOST = r"""
import json, sys, time, torch
import ferry, ferry.checkpoint as c
if sys.argv[2] == "during the reads":
    init = c._Torch.__init__
    def during(self, device):
        init(self, device)
        self.host = False
    c._Torch.__init__ = during
t0 = time.perf_counter()
d = ferry.load_checkpoint(sys.argv[1], device="cpu")
s = time.perf_counter() - t0
n = sum(v.numel() * v.element_size() for v in d.values())
r = ferry.last_load_report()
print(json.dumps({"seconds": s, "gbps": n / s / 1e9, "reads_seconds": r.seconds,
                  "cold_tasks": sum(x.direct_tasks for x in r.routes)}))
"""


def page_in(ckpt):
    for f in sorted(os.listdir(ckpt)):
        with open(os.path.join(ckpt, f), "rb") as fh:
            while fh.read(64 << 20):
                pass


def child(code, ckpt, variant):
    env = dict(os.environ)
    if variant.startswith("FERRY_"):  # a setting for this child: NAME=VALUE
        name, value = variant.split("=", 1)
        env[name] = value
    out = subprocess.run([sys.executable, "-c", code, ckpt, variant], capture_output=True,
                         text=True, env=env)
    if out.returncode:
        return {"error": out.stderr.strip()[-300:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def cli(path, ckpt):
    out = subprocess.run([path, "load", ckpt, "--gpu", "0", "--json"], capture_output=True,
                         text=True)
    if out.returncode:
        return {"error": out.stderr.strip()[-300:]}
    d = json.loads(out.stdout)
    return {"seconds": d["seconds"], "gbps": d["gbps"], "allocate_seconds": d["allocate_seconds"]}


gpu_ckpt, host_ckpt, cli_path = sys.argv[1:4]
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 5
cases = [("gpu", "load_checkpoint"), ("gpu", "warm_up first"), ("gpu", "ferry load --gpu 0"),
         ("gpu", "FERRY_BOUNCE_BUFFER_SIZE=2MiB"), ("gpu", "FERRY_NTHREADS=16"),
         ("host", "first"), ("host", "during the reads")]
if os.environ.get("PROBE_CASES"):  # a subset: variant names, comma-separated
    cases = [c for c in cases if c[1] in os.environ["PROBE_CASES"].split(",")]
rows = []
page_in(gpu_ckpt)
page_in(host_ckpt)
for r in range(rounds):
    for where, variant in (cases if r % 2 == 0 else list(reversed(cases))):
        if variant == "ferry load --gpu 0":
            row = cli(cli_path, gpu_ckpt)
        else:
            row = child(GPU if where == "gpu" else HOST, gpu_ckpt if where == "gpu" else host_ckpt,
                        variant)
        row.update({"where": where, "variant": variant, "round": r})
        rows.append(row)
        print(json.dumps(row), flush=True)
for where, variant in cases:
    rs = [x for x in rows if x["variant"] == variant and "gbps" in x]
    if not rs:
        print(f"{where:4} {variant:30} failed")
        continue
    g = sorted(x["gbps"] for x in rs)
    extra = "".join(f" {k} {statistics.median(x[k] for x in rs):.4f}"
                    for k in ("reads_seconds", "warm_up_seconds", "allocate_seconds", "cold_tasks")
                    if k in rs[0])
    print(f"{where:4} {variant:30} median {statistics.median(g):6.2f} GB/s ({g[0]:.2f}..{g[-1]:.2f},"
          f" n={len(g)}) s {statistics.median(x['seconds'] for x in rs):.4f}{extra}")
