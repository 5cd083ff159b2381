#!/usr/bin/env python3
"""`ferry stats -p PID` watching a Python process that reads through ferry (issue 15's evidence).

A child Python process reads a file through `ferry` in phases, and between and during the phases
this script asks `ferry stats -p PID` (text, --json, --watch, --prometheus) what the child did:

  posix   reads of a quarter of the file (64 MiB) with the default settings (ferry's POSIX
          path; into GPU N's memory with --gpu N, else into host memory)
  cufile  the same reads with compat_mode=off, which sends them to cuFile (GPU memory only; on a
          machine without nvidia-fs cuFile serves them through its compatibility path)

The counters read from outside are checked against the child's own ferry.stats() and against
what each phase must have added: requests and bytes per path, layer 2's pieces, the GPU's
memory bucket, nothing in flight between phases. Prints the outputs and one verdict line per
check; exits 1 if a check fails.

Usage: stats_watch.py [--ferry PATH] [--file PATH] [--mib N] [--gpu N] [--seconds S] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

CHILD = textwrap.dedent("""
    import json, sys, time, ferry
    path, gpu, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if gpu >= 0:
        import torch
        buf = torch.empty(size, dtype=torch.uint8, device=f"cuda:{gpu}")
    else:
        import numpy
        buf = numpy.empty(size, dtype=numpy.uint8)
    f = ferry.open(path)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "run":
            phase, seconds = cmd[1], float(cmd[2])
            scope = ferry.settings(compat_mode="off") if phase == "cufile" else ferry.settings()
            n = 0
            with scope:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    f.read(buf, file_offset=(n % 4) * size)
                    n += 1
            print("ok", json.dumps({"reads": n, "verdict": f.last_route.verdict}), flush=True)
        elif cmd[0] == "stats":
            print("ok", ferry.stats().to_json(), flush=True)
        elif cmd[0] == "exit":
            break
    f.close()
""")


class Child:
    def __init__(self, path: str, gpu: int, read_size: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, path, str(gpu), str(read_size)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self._line()
        if line != "ready":
            raise SystemExit(f"stats_watch: the child did not start: {line!r}")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def answer(self) -> Any:
        line = self._line()
        if not line.startswith("ok "):
            raise SystemExit(f"stats_watch: the child answered {line!r}")
        return json.loads(line[3:])

    def ask(self, command: str) -> Any:
        self.send(command)
        return self.answer()


def stats_cli(ferry: str, pid: int, *args: str) -> str:
    r = subprocess.run([ferry, "stats", "-p", str(pid), *args], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"stats_watch: ferry stats -p {pid} {' '.join(args)} failed: "
                         f"{r.stderr.strip()}")
    return r.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ferry", help="the ferry tool (default: the one ferry.__main__ finds)")
    p.add_argument("--file", default="/tmp/ferry-stats-watch.bin")
    p.add_argument("--mib", type=int, default=256, help="file size; each read is a quarter")
    p.add_argument("--gpu", type=int, default=-1, help="GPU ordinal (default: host memory)")
    p.add_argument("--seconds", type=float, default=2.0, help="length of each phase")
    p.add_argument("--out", help="also write everything printed to this file")
    a = p.parse_args()
    if a.ferry is None:
        from ferry import __main__ as ferry_main
        a.ferry = ferry_main.find_cli()
        if a.ferry is None:
            raise SystemExit("stats_watch: no ferry tool found (--ferry PATH)")

    lines: list[str] = []
    failed = 0

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        failed += 0 if ok else 1
        say(f"{'ok  ' if ok else 'FAIL'} {what}")

    size = a.mib << 20
    if not os.path.exists(a.file) or os.path.getsize(a.file) != size:
        with open(a.file, "wb") as out:
            out.write(os.urandom(size))
    phases = ["posix"] + (["cufile"] if a.gpu >= 0 else [])
    child = Child(a.file, a.gpu, size // 4)
    pid = child.proc.pid
    memory = f"gpu {a.gpu}" if a.gpu >= 0 else "host"
    say(f"# ferry stats -p {pid}: a Python process reading {a.file} into {memory} memory")
    try:
        # No request yet, so no segment yet: the counts start from zero.
        seen = {"posix": 0, "cufile": 0}
        for phase in phases:
            say(f"\n## phase {phase}: {a.seconds} s of {a.mib // 4} MiB reads"
                + (" with compat_mode=off" if phase == "cufile" else ", default settings"))
            child.send(f"run {phase} {a.seconds}")
            time.sleep(a.seconds / 3)
            watched = stats_cli(a.ferry, pid, "--watch", str(round(a.seconds / 3, 2)))
            done = child.answer()
            say(f"the child: {done['reads']} reads; its last route: {done['verdict']}")
            say(f"\n$ ferry stats -p {pid} --watch {round(a.seconds / 3, 2)}   (while it read)")
            say(watched.rstrip())
            j = json.loads(stats_cli(a.ferry, pid, "--json"))["process"]
            got = j["layer1"][phase]["requests"] - seen[phase]
            check(got == done["reads"],
                  f"{phase}: {got} requests seen from outside, {done['reads']} made")
            seen[phase] = j["layer1"][phase]["requests"]
            check(j["inflight"]["known"] and j["inflight"]["requests"] == 0,
                  f"{phase}: nothing in flight between phases ({j['inflight']})")
            names = [m["memory"] for m in j["memories"]]
            check(memory in names, f"{phase}: the reads are counted under '{memory}' ({names})")
            if phase == "cufile":
                pieces = j["layer2"]["nvfs"] + j["layer2"]["posix"] + j["layer2"]["p2p"]
                check(pieces > 0, f"cufile: layer 2 counted {pieces} piece(s) "
                      f"(nvfs={j['layer2']['nvfs']} posix={j['layer2']['posix']} "
                      f"p2p={j['layer2']['p2p']})")
        own = child.ask("stats")
        final = json.loads(stats_cli(a.ferry, pid, "--json"))["process"]
        check(own["requests"] == final["totals"]["requests"]
              and own["bytes_read"] == final["totals"]["bytes_read"],
              f"the child's ferry.stats() ({own['requests']} requests, {own['bytes_read']} B) "
              f"equals what was read from outside ({final['totals']['requests']}, "
              f"{final['totals']['bytes_read']} B)")
        say(f"\n$ ferry stats -p {pid}")
        say(stats_cli(a.ferry, pid).rstrip())
        prom = stats_cli(a.ferry, pid, "--prometheus")
        say(f"\n$ ferry stats -p {pid} --prometheus | grep -v '^#' | head -20")
        say("\n".join([l for l in prom.splitlines() if not l.startswith("#")][:20]))
        check("ferry_requests_total" in prom, "--prometheus has ferry_requests_total")
    finally:
        child.send("exit")
        child.proc.wait(timeout=60)
    say(f"\nstats_watch: {'all checks passed' if failed == 0 else f'{failed} check(s) FAILED'}")
    if a.out:
        with open(a.out, "w") as out:
            out.write("\n".join(lines) + "\n")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
