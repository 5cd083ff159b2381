"""scripts/check-layering (issue 32): the rooms of docs/architecture.md hold in the tree, and the
check fails on an include that climbs, on a tool that reaches past the public headers and on a
new test hook in a production header."""

import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "check-layering"
pytestmark = [pytest.mark.source_tree,
              pytest.mark.skipif(not SCRIPT.exists(),
                                 reason="no source tree here (the installed package's run)")]


def _check(root):
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True,
                          text=True)


def _tree(tmp_path, files):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for d in ("tools", "python/src"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    return tmp_path


def test_the_tree_keeps_its_rooms():
    r = _check(SCRIPT.parents[1])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 problem(s)" in r.stdout


def test_an_include_from_core_into_a_backend_fails(tmp_path):
    root = _tree(tmp_path, {
        "src/core/request.cc": '#include "core/request.h"\n#include "posix/posix_backend.h"\n',
        "src/posix/posix_backend.h": '#include "core/backend.h"\n',
        "src/io/io_seam.h": '#include "cuda/cuda_abi.h"\n',
    })
    r = _check(root)
    assert r.returncode == 1
    assert 'src/core/request.cc:2: includes "posix/posix_backend.h"' in r.stdout
    assert "1 problem(s)" in r.stdout, r.stdout


def test_a_room_below_reaching_up_fails(tmp_path):
    r = _check(_tree(tmp_path, {"src/io/page_cache.cc": '#include "core/open_file.h"\n'}))
    assert r.returncode == 1 and 'includes "core/open_file.h": io may include' in r.stdout


def test_a_tool_past_the_public_headers_and_an_unknown_room_fail(tmp_path):
    root = _tree(tmp_path, {"tools/ferry/main.cc": '#include "core/request.h"\n',
                            "src/quantum/http.cc": '#include "ferry/file.h"\n'})
    r = _check(root)
    assert r.returncode == 1
    assert "tools/ferry/main.cc:1" in r.stdout and "public headers" in r.stdout
    assert "src/quantum/: a room" in r.stdout


def test_a_new_test_hook_in_a_production_header_fails(tmp_path):
    root = _tree(tmp_path, {"src/core/file_state.h":
                            "namespace ferry::core {\nnamespace testing {\nvoid hook();\n}\n}\n"})
    r = _check(root)
    assert r.returncode == 1 and "src/core/file_state.h: test hook marker" in r.stdout, r.stdout


def test_an_allowance_above_its_headers_hooks_fails(tmp_path):
    """A header allowed more hook markers than it has would let a new one in unseen: the entry
    of src/core/routing.h outlived the hook it allowed (issue 46)."""
    root = _tree(tmp_path, {"src/cufile/cufile_library.h": "// no marker left\n"})
    r = _check(root)
    assert r.returncode == 1, r.stdout
    assert "src/cufile/cufile_library.h: 0 test hook marker(s), 1 allowed" in r.stdout, r.stdout
