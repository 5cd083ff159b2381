"""bench/stats_watch.py (issue 15's GPU evidence) on host memory here: a Python process reads
through ferry while `ferry stats -p PID` watches it, and every count seen from outside matches
what the process did."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ferry import __main__ as cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_stats_watch_sees_a_python_process_exactly(tmp_path):
    tool = cli.find_cli()
    if tool is None:
        pytest.skip("no ferry tool built or on PATH")
    stats_dir = tmp_path / "shm"
    stats_dir.mkdir()
    env = dict(os.environ, FERRY_STATS_DIR=str(stats_dir))
    out = tmp_path / "stats_watch.txt"
    p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "stats_watch.py"),
                        "--ferry", tool, "--file", str(tmp_path / "data.bin"), "--mib", "16",
                        "--seconds", "0.6", "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    text = out.read_text()
    assert "FAIL" not in text
    assert "ok   posix: " in text and "requests seen from outside" in text
    assert "the child's ferry.stats()" in text
    assert "ferry_requests_total{" in text
    assert text.rstrip().endswith("all checks passed")
    assert os.listdir(stats_dir) == [], "the child's segment is removed when it exits"
