"""Issue 47: the first server anyone tries, `python3 -m http.server`, ignores Range: it answers
every GET 200 with the whole file, and ferry refused the answer. It now reads it as curl does,
streaming the 200 body and cutting the range asked for out of it, one GET per read, and says so
in the route report; explain says what read will do; `ferry write URL` is refused as
ferry.open(url, "w") is. Every read is checked byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess

import numpy as np
import pytest

import ferry
from remote_servers import python_http  # noqa: F401 (the fixture)

pytestmark = pytest.mark.skipif(not ferry.remote_support()[0],
                                reason=f"no libcurl: {ferry.remote_support()[1]}")

SIZE = (9 << 20) + 4093  # more than two tasks of the default 4 MiB


def _bytes(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    cli = os.environ.get("FERRY_CLI")
    if not cli:
        pytest.skip("FERRY_CLI is not set")
    return subprocess.run([cli, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def served(python_http):  # noqa: F811 (the fixture)
    data = _bytes(SIZE, 47)
    return python_http.put("no-ranges/data.bin", data), data


def test_python_api_reads_exact_bytes_from_one_get(served):
    url, data = served
    with ferry.open(url) as f:
        assert f.size == len(data)
        whole = np.empty(len(data), np.uint8)
        assert f.pread(whole).result() == len(data)
        assert whole.tobytes() == data
        route = f.last_route
        assert route.tasks > 1 and route.workers == 1
        assert route.source.range_ignored and route.source.gets == 1
        assert route.source.bytes == len(data) and route.source.discarded == 0
        assert "the server ignores Range: streamed in order from 1 GET(s)" in route.to_text()
        assert json.loads(route.to_json())["source"]["range_ignored"] is True

        offset, n = 5_000_001, 3_000_000  # mid-file, across a task boundary
        part = np.empty(n, np.uint8)
        assert f.pread(part, file_offset=offset).result() == n
        assert part.tobytes() == data[offset:offset + n]
        assert f.last_route.source.gets == 1 and f.last_route.source.discarded == offset

        rows = np.zeros(300, np.uint8)
        got = f.pread_ranges(rows, [(10, 100, 0), (4_500_000, 100, 100), (SIZE - 100, 100, 200)])
        assert got.result() == 300
        assert rows.tobytes() == data[10:110] + data[4_500_000:4_500_100] + data[-100:]
        assert f.last_route.source.gets == 1


def test_cli_read_and_explain_say_the_read_streams(served):
    url, data = served
    r = _cli("read", url, "--host", "--checksum", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["bytes"] == len(data) and out["sha256"] == hashlib.sha256(data).hexdigest()
    assert out["route"]["source"]["range_ignored"] is True
    assert out["route"]["source"]["gets"] == 1
    r = _cli("read", url, "--host", "--offset", "1000", "--size", "5000", "--checksum")
    assert r.returncode == 0, r.stderr
    assert hashlib.sha256(data[1000:6000]).hexdigest() in r.stdout
    assert "the server ignores Range: streamed in order from 1 GET(s)" in r.stdout
    assert "1000 B before the bytes asked for received and discarded" in r.stdout
    # explain's open sends a HEAD only, which http.server answers without Accept-Ranges: it says
    # it cannot know, and what the read will do, never "ranged GETs at once".
    r = _cli("explain", url, "--host", "--offset", "1000")
    assert r.returncode == 0, r.stderr
    assert ("one GET from byte 1000, streamed in order on one worker: the server has not said "
            "whether it serves ranges (its HEAD answer had no Accept-Ranges)") in r.stdout, r.stdout
    assert "the 1000 B before offset 1000 received and discarded" in r.stdout
    assert "ranged GETs" not in r.stdout


def test_load_checkpoint_from_http_server(python_http, tmp_path):  # noqa: F811
    torch = pytest.importorskip("torch")
    import ferry.safetensors.torch as fst

    g = torch.Generator().manual_seed(47)
    tensors = {
        "embed.weight": torch.randn(1000, 64, generator=g).to(torch.bfloat16),
        "layers.0.bias": torch.randn(64, generator=g),
        "layers.0.weight": torch.randn(64, 64, generator=g).half(),
        "ids": torch.arange(33, dtype=torch.int64),
    }
    path = tmp_path / "model.safetensors"
    fst.save_file(tensors, path, {"format": "pt"})
    url = python_http.put("no-ranges/ckpt/model.safetensors", path.read_bytes())
    for source in (url, url.rsplit("/", 1)[0]):  # the file, and its folder as a prefix
        got = ferry.load_checkpoint(source)
        assert set(got) == set(tensors)
        for name, t in tensors.items():
            assert got[name].dtype == t.dtype and torch.equal(got[name], t), name


def test_cli_write_refuses_a_url_as_a_usage_error(tmp_path):
    # It was taken for a local path once ("open http://.../.x.bin.ferry-...: No such file"), then
    # refused as a failed write (exit 1): a URL is refused as the command line is read.
    r = _cli("write", "http://127.0.0.1:1/x", "--size", "4KiB", "--host", cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "http://127.0.0.1:1/x is a URL" in r.stderr
    assert "remote objects are read-only in ferry" in r.stderr and "local path" in r.stderr
    assert list(tmp_path.iterdir()) == []  # no http: folder, no temporary file
    with pytest.raises(ferry.Error, match="remote objects are read-only in ferry"):
        ferry.open("http://127.0.0.1:1/x", "w")
