"""Remote checkpoints in few requests (issue 48), against nginx on 127.0.0.1 whose access log
counts what ferry asked: many small tensors coalesced into spans of about task_size, about
ceil(bytes / task_size) + 3 requests in all, the bytes those of the local load, and the load
report counting the GETs, retries and connections."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

import ferry
import ferry.safetensors.torch
import remote_servers as rs

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not ferry.remote_support()[0],
                                reason=f"no libcurl: {ferry.remote_support()[1]}")

TASK = 4 << 20  # the default task_size


@pytest.fixture()
def logged(tmp_path):
    """(base URL, served root, access log) of an nginx that logs every request."""
    root = tmp_path / "root"
    root.mkdir()
    log = tmp_path / "access.log"
    try:
        cm = rs.nginx_server(root, access_log=log)
        base = cm.__enter__()
    except rs.ServerUnavailable as e:
        pytest.skip(str(e))
    try:
        yield base, root, log
    finally:
        cm.__exit__(None, None, None)


def _small_tensors(n: int) -> dict:
    g = torch.Generator().manual_seed(48)
    return {f"layers.{i:04d}.w": torch.randn(4096, generator=g) for i in range(n)}  # 16 KiB


def test_many_small_tensors_take_about_one_get_per_task_size(logged):
    base, root, log = logged
    tensors = _small_tensors(3000)
    ferry.safetensors.torch.save_file(tensors, root / "model.safetensors")
    url = f"{base}/model.safetensors"
    got = ferry.load_checkpoint(url)
    report = ferry.last_load_report()
    requests = rs.access_log_requests(log)
    data = sum(t.numel() * 4 for t in tensors.values())
    assert len(requests) <= math.ceil(data / TASK) + 3, "\n".join(requests[:20])
    assert sum('"HEAD ' in r for r in requests) == 1
    want = ferry.load_checkpoint(root / "model.safetensors")
    assert set(got) == set(want)
    for name, t in want.items():
        assert torch.equal(got[name], t), name
    gets = [r for r in requests if r.startswith('"GET ')]
    assert report.gets == len(gets) - 1  # the header's GET came with the open
    assert report.retries == 0 and report.connections <= report.gets
    assert f"{report.gets} GET(s)" in report.summary()
    assert json.loads(report.to_json())["gets"] == report.gets


def test_big_tensors_are_read_in_place_in_task_size_gets(logged):
    base, root, log = logged
    g = torch.Generator().manual_seed(7)
    tensors = {"big": torch.randn(3 << 20, generator=g),  # 12 MiB: 3 GETs
               **_small_tensors(100)}
    ferry.safetensors.torch.save_file(tensors, root / "model.safetensors")
    got = ferry.load_checkpoint(f"{base}/model.safetensors")
    for name, t in tensors.items():
        assert torch.equal(got[name], t), name
    assert ferry.last_load_report().gets == 3 + 1


def test_cli_load_says_the_gets(logged):
    base, root, _ = logged
    ferry.safetensors.torch.save_file(_small_tensors(500), root / "model.safetensors")
    cli = os.environ.get("FERRY_CLI", str(Path(__file__).resolve().parents[2] / "build/tools/ferry"))
    url = f"{base}/model.safetensors"
    text = subprocess.run([cli, "load", url, "--host"], capture_output=True, text=True)
    assert text.returncode == 0, text.stderr
    assert "remote: 2 GET(s) for 500 tensor(s)" in text.stdout, text.stdout
    out = subprocess.run([cli, "load", url, "--host", "--json"], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["gets"] == 2
