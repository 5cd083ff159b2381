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


# A virtual environment that was not activated: `venv/bin/python -m ferry` runs venv/bin/ferry,
# where pip put the tool, though PATH does not name venv/bin. The package is run as a wheel
# installs it, without a tool built beside the extension (_ferry.cli_path None); the tools are
# stand-ins that say which they are (a real pip install takes minutes).
_AS_INSTALLED = ("import sys, runpy, ferry._ferry as m; m.cli_path = None; "
                 "runpy.run_module('ferry', run_name='__main__', alter_sys=True)")


def _stand_in(folder, words):
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "ferry"
    tool.write_text(f'#!/bin/sh\necho "{words}" "$@"\n')
    tool.chmod(0o755)
    return tool


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no /usr/bin/python3 to make a virtual environment with")
    folder = tmp_path_factory.mktemp("venv") / "env"
    made = subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages",
                           "--without-pip", str(folder)], capture_output=True, text=True,
                          timeout=120)
    if made.returncode != 0:
        pytest.skip(f"python3 -m venv failed (python3-venv missing?): {made.stderr.strip()}")
    return folder


def _run_in(venv, args, path):
    # The package under test (the tree's or the installed one) on the venv's path; no FERRY_CLI.
    env = {k: v for k, v in os.environ.items() if k != "FERRY_CLI"}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.realpath(cli.__file__)))
    env["PATH"] = path
    return subprocess.run([str(venv / "bin" / "python"), "-c", _AS_INSTALLED, *args],
                          capture_output=True, text=True, env=env, timeout=60)


def test_finds_the_tool_in_a_venv_that_was_not_activated(venv, tmp_path):
    elsewhere = _stand_in(tmp_path / "elsewhere", "ferry on PATH")
    path = f"{elsewhere.parent}:/usr/bin:/bin"
    tool = _stand_in(venv / "bin", "ferry of the venv")
    try:
        done = _run_in(venv, ["check"], path)
    finally:
        tool.unlink()
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ferry of the venv check\n"
    # Without one beside the interpreter, PATH's.
    done = _run_in(venv, ["check"], path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ferry on PATH check\n"


def test_no_tool_anywhere_says_where_it_looked(venv, tmp_path):
    done = _run_in(venv, ["check"], str(tmp_path))
    assert done.returncode == 1
    assert "the ferry tool was not found" in done.stderr
    assert str(venv / "bin") in done.stderr, done.stderr
