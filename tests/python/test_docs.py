"""The README and docs/*.md name only files that a reader of the repository can open: every
path they give under one of the repository's top-level folders exists (evidence in
bench/results/, scripts, sources), and none is in the team's notes outside it (shared/)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.source_tree,
              pytest.mark.skipif(not (ROOT / "docs").is_dir(),
                                 reason="no source tree here (the installed package's run)")]
TOP = ("src", "include", "tests", "tools", "python", "bench", "scripts", "docs", "cmake", ".ci",
       "shared")
# A path not preceded by a word, a slash, a dot or `$` (`$PWD/python` is no path of the
# repository), ending before punctuation.
PATH = re.compile(r"(?<![\w/.$-])((?:%s)/[\w./*-]*[\w/*])" % "|".join(re.escape(t) for t in TOP))
# Paths of other repositories, named with their repository in the text.
ELSEWHERE = {"python/kvikio/tests"}  # rapidsai/kvikio's test folder (docs/kvikio.md)


def named_paths():
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for match in PATH.finditer(line):
                yield f"{doc.relative_to(ROOT)}:{number}", match.group(1)


def test_every_path_the_docs_name_exists():
    named = list(named_paths())
    assert {"bench/NOTES.md", "scripts/setup"} <= {path for _, path in named}, "the scan is blind"
    missing = []
    for where, path in named:
        if path in ELSEWHERE:
            continue
        found = list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()
        if not found:
            missing.append(f"{where}: {path}")
    assert not missing, "\n".join(missing)
