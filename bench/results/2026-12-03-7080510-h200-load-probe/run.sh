#!/usr/bin/env bash
# Issue 32's host-load bisect and issue 29's GPU-load diagnosis, on the GPU machine, with ferry
# CLIs built on the CPU machine (Release, g++ 12) and carried in .carry/bin/<commit>/ferry (their
# libfmt.so.9 in .carry/lib). Usage: bash run.sh OUT
set -u
out=${1:?OUT}; mkdir -p "$out"; here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=$PWD/.carry/lib
mkdir -p /run/udev/data; printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n' >/run/udev/data/b254:0
w=/tmp/ferry-probe-data; rm -rf "$w"; mkdir -p "$w/q" "$w/m"
python3 "$here/mk_ckpt.py" qwen "$w/q" && python3 "$here/mk_ckpt.py" mistral "$w/m"
cat "$w"/q/* "$w"/m/* >/dev/null
names=$(ls .carry/bin)
row() {  # tag... then the command
  local tag=$1; shift
  timeout 60 "$@" --json 2>>"$out/err.txt" | python3 -c '
import json, sys
d = json.load(sys.stdin); tag = json.loads(sys.argv[1])
tag.update({k: d.get(k) for k in ("gbps", "seconds", "allocate_seconds", "cpu_seconds", "cuda_start_seconds")})
tag["tasks"] = sum(r.get("tasks", 0) for r in d.get("routes", [d]))
print(json.dumps(tag))' "$tag" >>"$out/rows.jsonl" 2>>"$out/err.txt"
}
# 1. Host load of the 4 GiB Qwen2 layout (arch-check's), every build, fresh processes, the order
#    shuffled each round.
t0=$(date +%s)
for r in $(seq "${HOST_ROUNDS:-15}"); do
  for n in $(printf '%s\n' $names | shuf --random-source=<(yes $r)); do
    row "{\"case\":\"host load qwen\",\"build\":\"$n\",\"round\":$r}" .carry/bin/$n/ferry load "$w/q" --host
  done
done
echo "host rounds: $(( $(date +%s) - t0 )) s" >>"$out/err.txt"
# 2. GPU load of the 14.5 GB Mistral layout: head's variants, and e632413 (the gather fix, before
#    the architecture step) beside it.
h=.carry/bin/head/ferry
for r in $(seq "${GPU_ROUNDS:-5}"); do
  for n in head k4 k1 prealloc e632413 c7cc1a4; do
    [ -x .carry/bin/$n/ferry ] &&
      row "{\"case\":\"gpu load mistral\",\"build\":\"$n\",\"variant\":\"default\",\"round\":$r}" .carry/bin/$n/ferry load "$w/m" --gpu 0
  done
  row "{\"case\":\"gpu load mistral\",\"build\":\"head\",\"variant\":\"one-allocation\",\"round\":$r}" $h load "$w/m" --gpu 0 --one-allocation
  for v in FERRY_NTHREADS=12 FERRY_NTHREADS=16 FERRY_TASK_SIZE=8MiB FERRY_TASK_SIZE=16MiB FERRY_BOUNCE_BUFFER_SIZE=8MiB; do
    row "{\"case\":\"gpu load mistral\",\"build\":\"head\",\"variant\":\"$v\",\"round\":$r}" env $v $h load "$w/m" --gpu 0
  done
  for s in "$w"/m/*.safetensors; do
    row "{\"case\":\"gpu read shard\",\"build\":\"head\",\"variant\":\"$(basename $s)\",\"round\":$r}" $h read "$s" --gpu 0
  done
done
$h load "$w/m" --gpu 0 >"$out/gpu-load.txt" 2>&1
python3 - "$out/rows.jsonl" <<'PY' | tee "$out/summary.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = {}
for r in rows:
    keys.setdefault((r["case"], r["build"], r.get("variant", "")), []).append(r)
for (case, build, variant), rs in keys.items():
    g = sorted(x["gbps"] for x in rs)
    a = [x["allocate_seconds"] for x in rs if x.get("allocate_seconds") is not None]
    print(f"{case:18} {build:8} {variant:30} n={len(g):2} median {statistics.median(g):6.2f} GB/s "
          f"[{g[0]:.2f}..{g[-1]:.2f}] s={statistics.median(x['seconds'] for x in rs):.4f}"
          + (f" alloc={statistics.median(a):.4f}" if a else ""))
PY
rm -rf "$w"
