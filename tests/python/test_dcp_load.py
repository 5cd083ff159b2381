"""DCP folders open for inference (issue 51 item 2): ferry.load_checkpoint and `ferry load` read
the golden folders stock torch 2.11 wrote (tests/data/dcp) without torch's DCP module, and return
every tensor with the bytes stock dcp.load returns."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ferry

DATA = Path(__file__).resolve().parents[1] / "data" / "dcp"
EXPECTED = json.loads((DATA / "expected.json").read_text())


@pytest.mark.parametrize("folder", ["single", "two_ranks"])
def test_load_checkpoint_matches_stock_dcp_load(folder):
    tensors = ferry.load_checkpoint(DATA / folder, device="cpu")
    want = {k: v for k, v in EXPECTED[folder].items() if "sha256" in v}
    assert sorted(tensors) == sorted(want)
    for name, t in tensors.items():
        e = want[name]
        assert str(t.dtype).replace("torch.", "") == e["dtype"], name
        assert list(t.shape) == e["shape"], name
        data = t.contiguous().reshape(-1).view(-1).numpy().view("uint8").tobytes() \
            if t.dtype.is_floating_point is False or t.dtype != __import__("torch").bfloat16 \
            else t.contiguous().reshape(-1).view(__import__("torch").int16).numpy().tobytes()
        assert hashlib.sha256(data).hexdigest() == e["sha256"], name
    report = ferry.last_load_report()
    skipped = [k for k, v in EXPECTED[folder].items() if "value" in v]
    assert f"{len(skipped)} non-tensor item(s) skipped" in report.summary()


def _cli():
    return os.environ.get("FERRY_CLI") or shutil.which("ferry")


@pytest.mark.skipif(not _cli(), reason="FERRY_CLI not set")
def test_cli_load_lists_a_dcp_folder():
    out = subprocess.run([_cli(), "load", str(DATA / "two_ranks"), "--host"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert "10 tensors" in out.stdout + out.stderr, out.stdout


def test_a_truncated_distcp_names_the_file_and_offset(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(DATA / "single", folder)
    with open(folder / "__0_0.distcp", "r+b") as f:
        f.truncate(9000)
    with pytest.raises(ferry.CheckpointError, match=r"__0_0\.distcp.*offset .*truncated"):
        ferry.load_checkpoint(folder, device="cpu")


def test_a_missing_rank_file_is_named(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(DATA / "two_ranks", folder)
    os.remove(folder / "__1_0.distcp")
    with pytest.raises(ferry.CheckpointError, match=r"__1_0\.distcp.*missing"):
        ferry.load_checkpoint(folder, device="cpu")
