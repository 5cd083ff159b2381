import os, sys, time, torch, ferry
from ferry import checkpoint as c
# Each iter_weights pass's Checkpoint.start_read_into calls, timed, in ms: one line a pass.
# Usage: PYTHONPATH=<tree>/python python3 submit_times.py MODEL_DIR [PASSES]
# (MODEL_DIR: bench/iter_weights_bench.py --device cpu --size 256MiB makes one.)
d = sys.argv[1]
log = []
real = c.Checkpoint.start_read_into
def traced(self, targets):
    targets = list(targets)
    t = time.perf_counter()
    p = real(self, targets)
    log.append((time.perf_counter() - t, sum(t_[3] if len(t_) > 3 else 0 for t_ in targets)))
    return p
c.Checkpoint.start_read_into = traced
for rnd in range(int(sys.argv[2]) if len(sys.argv) > 2 else 5):
    log.clear()
    for name, x in ferry.iter_weights(d, device="cpu", memory_budget=64 << 20):
        del x
    print(" ".join(f"{s*1e3:.2f}" for s, _ in log))
