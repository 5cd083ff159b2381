#!/usr/bin/env python3
"""Instructions a 4 KiB read costs from Python, in user space: os.preadv, ferry's File.read and
File.pread().result(), counted by callgrind (a loop of N calls, minus the same process with
none; the system call is not counted). Wall clocks on a shared VM swing 2x; instruction counts
do not. bench/NOTES.md §30 and §35.

  python3 bench/python_call_cost.py [--calls 20000] [--cases os,read,pread] [--buffer bytearray]
  python3 bench/python_call_cost.py --loop read 1000     (one loop, what callgrind runs)
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def loop(case: str, calls: int, path: str, buffer: str) -> None:
    sys.path.insert(0, os.path.join(HERE, "..", "python"))
    import ferry
    if buffer == "numpy":
        import numpy as np
        buf, size = np.empty(4096, np.uint8), 4096
    else:  # as bench/python_small.py calls it (no NumPy needed)
        buf, size = bytearray(4096), None
    if case == "os":
        fd = os.open(path, os.O_RDONLY)
        for i in range(calls):
            os.preadv(fd, [buf], (i & 2047) * 4096)
        os.close(fd)
        return
    f = ferry.open(path, "r")
    if case == "read":
        for i in range(calls):
            f.read(buf, size, (i & 2047) * 4096)
    else:
        for i in range(calls):
            f.pread(buf, size, (i & 2047) * 4096).result()
    f.close()


def instructions(case: str, calls: int, path: str, buffer: str) -> int:
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.out", sys.executable,
             os.path.abspath(__file__), "--loop", case, str(calls), "--file", path, "--buffer", buffer],
            capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if run.returncode != 0 or not found:
        sys.exit(f"callgrind of {case} failed (rc {run.returncode}):\n{run.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--cases", default="os,read,pread")
    ap.add_argument("--file", default=None, help="an 8 MiB file to read (made when absent)")
    ap.add_argument("--buffer", choices=("numpy", "bytearray"), default="numpy",
                    help="a NumPy array with size=4096, or a bytearray with size=None as "
                    "bench/python_small.py reads")
    ap.add_argument("--loop", nargs=2, metavar=("CASE", "CALLS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loop:
        loop(args.loop[0], int(args.loop[1]), args.file, args.buffer)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = args.file or os.path.join(tmp, "cost.bin")
        if not args.file:
            with open(path, "wb") as f:
                f.write(os.urandom(8 << 20))
        for case in args.cases.split(","):
            per_call = (instructions(case, args.calls, path, args.buffer) -
                        instructions(case, 0, path, args.buffer)) / args.calls
            print(f"{case:6s} {per_call:8.0f} instructions a call")


if __name__ == "__main__":
    main()
