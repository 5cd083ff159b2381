"""Python's host load with the allocation policy of 0f97bf1 (pageable host memory allocated before
any read) against the one before it (a part at a time, during the reads), fresh processes, the
order alternating. Usage: py_host_ab.py CHECKPOINT [ROUNDS]"""
import json, subprocess, sys

CHILD = r"""
import sys, time, json
import ferry, ferry.checkpoint as c
if sys.argv[2] == "during-reads":
    init = c._Torch.__init__
    def during(self, device):
        init(self, device)
        self.host = False
    c._Torch.__init__ = during
t = time.perf_counter()
d = ferry.load_checkpoint(sys.argv[1], device="cpu")
s = time.perf_counter() - t
n = sum(v.numel() * v.element_size() for v in d.values())
print(json.dumps({"policy": sys.argv[2], "seconds": s, "gbps": n / s / 1e9}))
"""
path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7
rows = []
for r in range(rounds):
    for policy in (("first", "during-reads") if r % 2 == 0 else ("during-reads", "first")):
        out = subprocess.run([sys.executable, "-c", CHILD, path, policy], check=True,
                             capture_output=True, text=True).stdout
        rows.append(json.loads(out))
        print(out.strip(), flush=True)
for policy in ("first", "during-reads"):
    g = sorted(x["gbps"] for x in rows if x["policy"] == policy)
    print(f"{policy:13} median {g[len(g) // 2]:.2f} GB/s ({g[0]:.2f}..{g[-1]:.2f}, n={len(g)})")
