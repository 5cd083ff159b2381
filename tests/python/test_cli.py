"""`python -m ferry` finds and runs the command-line tool."""

import os
import subprocess
import sys

import pytest

from ferry import __main__ as cli


def _run(args, **env):
    return subprocess.run([sys.executable, "-m", "ferry", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


def test_ferry_cli_environment_variable_wins():
    done = _run(["read", "--flag"], FERRY_CLI="/bin/echo")
    assert done.returncode == 0 and done.stdout == "read --flag\n"


def test_runs_the_built_tool():
    if cli.find_cli() is None:
        pytest.skip("no ferry tool built or on PATH")
    done = _run(["--help"])
    assert done.returncode == 0 and "ferry" in done.stdout
