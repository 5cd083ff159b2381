"""README.md cannot rot: every shell command and Python snippet in it runs here exactly as
written, in order, in a fresh folder (host memory where there is no GPU).

The commands run in a temporary folder that holds a link `build` to the real build folder, so
`build/tools/ferry` means what it means at the repository root and the files the README makes
(model.safetensors, data.bin) land in the temporary folder, not in the repository.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.source_tree

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# The first two commands (scripts/setup && ..., scripts/setup && scripts/test) install packages,
# build and run the whole test suite: CI runs exactly them as its own steps, and running them
# again from inside that suite would recurse. Every other command is run.
SKIPPED = ("scripts/setup", "scripts/test")


def blocks(language):
    """The README's fenced blocks in `language`, in order."""
    text = README.read_text()
    return re.findall(r"^```" + language + r"\n(.*?)^```", text, flags=re.S | re.M)


def commands():
    """Each command line of the README's sh blocks (a trailing comment kept: the shell drops
    it), with a line continued by a backslash joined to the next."""
    out = []
    for block in blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                out.append(line)
    return out


def build_dir():
    if os.environ.get("FERRY_EXPECT_INSTALLED"):
        pytest.skip("the README's commands use the build at the repository root; this run "
                    "tests the installed package, and the run from the build covers the README")
    cli = os.environ.get("FERRY_CLI")
    if not cli or not (Path(cli).resolve().parents[1] / "tools" / "ferry").exists():
        pytest.skip("FERRY_CLI is not build/tools/ferry of a build folder: the README's "
                    "commands need it")
    return Path(cli).resolve().parents[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    (d / "build").symlink_to(build_dir())
    return d


def run(argv, folder, **kwargs):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "python"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300,
                          **kwargs)


def test_the_readme_has_what_a_newcomer_needs_and_stays_short():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    first = commands()[:2]
    assert first[0].startswith("scripts/setup && build/tools/ferry demo")
    assert first[1].startswith("scripts/setup && scripts/test")
    assert any(line.startswith("scripts/test --quick") for line in commands()), "no quick test"
    assert blocks("python"), "no Python quick start"
    # Every snippet runs below: a fenced block of another language (or of none) would rot.
    fences = re.findall(r"^```(.*)$", text, flags=re.M)
    assert len(fences) % 2 == 0, "an unclosed fenced block"
    assert set(fences[0::2]) <= {"sh", "python"}, fences[0::2]


def test_every_python_snippet_runs_as_written(folder):
    # In order: the first one writes the checkpoint the others read.
    for snippet in blocks("python"):
        done = run([sys.executable, "-c", snippet], folder)
        assert done.returncode == 0, f"{snippet}\n{done.stdout}\n{done.stderr}"


def test_every_shell_command_runs_as_written(folder):
    # The Python snippets make model.safetensors, which the commands load.
    for snippet in blocks("python"):
        run([sys.executable, "-c", snippet], folder)
    ran = 0
    for line in commands():
        if any(line.lstrip().startswith(s) for s in SKIPPED):
            continue
        done = run(["bash", "-c", "set -eo pipefail; " + line], folder)
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        ran += 1
    assert ran >= 5
