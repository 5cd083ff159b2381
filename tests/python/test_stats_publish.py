"""A Python process's published counters (docs/stats.md): `ferry.stats()` keeps working,
`ferry.stats.publish(False)` opts out at run time, and `ferry stats -p PID` (or
`ferry.stats.of(pid)`) reads them from outside, in a child process with a stats directory of its
own."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

import ferry
from ferry import __main__ as cli

CHILD = textwrap.dedent("""
    import sys, ferry
    path = sys.argv[1]
    print("ready", flush=True)
    with ferry.open(path) as f:
        buf = bytearray(4096)
        for line in sys.stdin:
            cmd = line.split()
            if cmd[0] == "read":
                for i in range(int(cmd[1])):
                    f.read(buf, file_offset=(i % 16) * 4096)
                print("ok", flush=True)
            elif cmd[0] == "publish":
                s = ferry.stats.publish(cmd[1] == "1")
                print("ok", int(s.published), s.path or s.why_not, flush=True)
            elif cmd[0] == "stats":
                print("ok", ferry.stats().to_json(), flush=True)
            elif cmd[0] == "exit":
                break
""")


class Child:
    def __init__(self, data: str, stats_dir: str, **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, data], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, "FERRY_STATS_DIR": stats_dir, **env})
        assert self.ask_line() == "ready"

    def ask_line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer = self.ask_line()
        assert answer.startswith("ok"), answer
        return answer[3:]

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=60)


@pytest.fixture
def setup(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(1 << 16))
    stats_dir = tmp_path / "shm"
    stats_dir.mkdir()
    return str(data), str(stats_dir)


def _segment(stats_dir: str, pid: int) -> str:
    return os.path.join(stats_dir, f"ferry.{os.geteuid()}.{pid}")


def test_a_child_publishes_and_is_read_from_outside(setup):
    data, stats_dir = setup
    child = Child(data, stats_dir)
    try:
        child.ask("read 40")
        seg = _segment(stats_dir, child.proc.pid)
        assert stat.S_IMODE(os.stat(seg).st_mode) == 0o600
        p = ferry.stats.of(child.proc.pid, stats_dir)
        assert p["totals"]["requests"] == 40
        assert p["totals"]["bytes_read"] == 40 * 4096
        assert p["layer1"]["posix"]["requests"] == 40
        own = json.loads(child.ask("stats"))
        assert own["requests"] == 40
        # Opted out at run time: gone from outside, still counted inside.
        assert child.ask("publish 0").startswith("0 ")
        assert not os.path.exists(seg)
        with pytest.raises(ferry.Error, match="publishes no ferry counters"):
            ferry.stats.of(child.proc.pid, stats_dir)
        child.ask("read 2")
        assert json.loads(child.ask("stats"))["requests"] == 42
        # And back: every count since the start.
        assert child.ask("publish 1").startswith("1 ")
        assert ferry.stats.of(child.proc.pid, stats_dir)["totals"]["requests"] == 42
    finally:
        assert child.close() == 0
    assert not os.path.exists(_segment(stats_dir, child.proc.pid)), "a normal exit removes it"


def test_the_cli_reads_a_python_process(setup):
    tool = cli.find_cli()
    if tool is None:
        pytest.skip("no ferry tool built or on PATH")
    data, stats_dir = setup
    child = Child(data, stats_dir)
    try:
        child.ask("read 25")
        done = subprocess.run([tool, "stats", "-p", str(child.proc.pid), "--dir", stats_dir,
                               "--json"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        p = json.loads(done.stdout)["process"]
        assert p["command"].startswith("python")
        assert p["totals"]["requests"] == 25
        assert p["totals"]["bytes_read"] == 25 * 4096
    finally:
        child.close()


def test_publishing_off_by_environment(setup):
    data, stats_dir = setup
    child = Child(data, stats_dir, FERRY_STATS_PUBLISH="0")
    try:
        child.ask("read 3")
        assert not os.listdir(stats_dir)
        assert json.loads(child.ask("stats"))["requests"] == 3
    finally:
        child.close()


def test_this_process_status_and_stats_keep_working(tmp_path):
    path = tmp_path / "x.bin"
    path.write_bytes(b"a" * 8192)
    with ferry.open(str(path)) as f:
        f.read(bytearray(4096))
    status = ferry.stats.published
    assert status.wanted == bool(status.wanted)
    if status.published:
        assert os.path.exists(status.path)
    before = ferry.stats().requests
    off = ferry.stats.publish(False)
    assert not off and not off.published
    with ferry.open(str(path)) as f:
        f.read(bytearray(4096))
    assert ferry.stats().requests == before + 1
    on = ferry.stats.publish(True)
    if on:  # where /dev/shm (or FERRY_STATS_DIR) is writable
        assert ferry.stats.of(os.getpid())["totals"]["requests"] >= before + 1
    assert isinstance(on.to_dict()["why_not"], str)
