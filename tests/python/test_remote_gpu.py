"""Remote sources into GPU memory from Python (needs a GPU and PyTorch; skipped with the reason
otherwise): a sharded checkpoint over HTTP through ferry.load_checkpoint (Python's own load
scheduler, not C++'s Checkpoint::load), safetensors' load_file and a File read into a CUDA
tensor, each equal to the bytes served. The server is nginx where installed, else
ferry-http-serve (tests/remote; the GPU machine has no nginx), found beside FERRY_CLI's build or
named by FERRY_HTTP_SERVE."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import ferry
import remote_servers as rs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not ferry.remote_support()[0],
                                 reason=f"no libcurl: {ferry.remote_support()[1]}")]


def _http_serve_binary() -> Path | None:
    named = os.environ.get("FERRY_HTTP_SERVE")
    if named:
        return Path(named)
    cli = os.environ.get("FERRY_CLI")
    if cli:
        candidate = Path(cli).resolve().parents[1] / "tests" / "remote" / "ferry-http-serve"
        if candidate.exists():
            return candidate
    return None


@contextlib.contextmanager
def _serve(root: Path):
    try:
        with rs.nginx_server(root) as url:
            yield url
            return
    except rs.ServerUnavailable as why_not_nginx:
        binary = _http_serve_binary()
        if binary is None:
            pytest.skip(f"{why_not_nginx}; and no ferry-http-serve (set FERRY_HTTP_SERVE)")
    port_file = root.parent / f"{root.name}.port"
    proc = subprocess.Popen([str(binary), str(root), "--port-file", str(port_file)],
                            stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no ferry-http-serve"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text().strip()}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


def test_checkpoint_and_file_from_http_into_the_gpu(torch, tmp_path):
    import ferry.safetensors.torch as fst

    g = torch.Generator().manual_seed(5)
    tensors = {f"layers.{i}.weight": torch.randn(512 + i, 257, generator=g).to(torch.bfloat16)
               for i in range(12)}
    tensors.update({"bias": torch.randn(33, generator=g), "ids": torch.arange(9),
                    "empty": torch.zeros(0, 2), "scalar": torch.tensor(1.5)})
    root = tmp_path / "www"
    ferry.save_checkpoint(tensors, root / "sharded", max_shard_size=1 << 20)
    fst.save_file(tensors, root / "one.safetensors")
    blob = os.urandom((9 << 20) + 5)
    (root / "blob.bin").write_bytes(blob)
    with _serve(root) as base:
        for got in (ferry.load_checkpoint(f"{base}/sharded", device="cuda:0"),
                    fst.load_file(f"{base}/one.safetensors", device="cuda:0")):
            assert set(got) == set(tensors)
            for name, t in tensors.items():
                assert got[name].device.type == "cuda", name
                assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
                assert torch.equal(got[name].cpu(), t), name
        dst = torch.empty(len(blob), dtype=torch.uint8, device="cuda:0")
        with ferry.open(f"{base}/blob.bin") as f:
            assert f.pread(dst).result() == len(blob)
            route = f.last_route
        assert bytes(dst.cpu().numpy()) == blob
        assert route.source.remote and route.source.bytes == len(blob)
        assert route.reasons[0].code == "remote_source" and route.memory == "gpu"
