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

torch = pytest.importorskip("torch")

DATA = Path(__file__).resolve().parents[1] / "data" / "dcp"
EXPECTED = json.loads((DATA / "expected.json").read_text())


def _sha256(t):
    """The digest of a tensor's bytes in C order, as bench/dcp_golden.py takes it."""
    flat = t.contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


@pytest.mark.parametrize("folder", ["single", "two_ranks"])
def test_load_checkpoint_matches_stock_dcp_load(folder):
    tensors = ferry.load_checkpoint(DATA / folder, device="cpu")
    want = {k: v for k, v in EXPECTED[folder].items() if "sha256" in v}
    assert sorted(tensors) == sorted(want)
    for name, t in tensors.items():
        e = want[name]
        assert str(t.dtype).replace("torch.", "") == e["dtype"], name
        assert list(t.shape) == e["shape"], name
        assert _sha256(t) == e["sha256"], name
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


@pytest.mark.parametrize("folder", ["single", "two_ranks"])
def test_iter_weights_and_shard_slices_of_a_dcp_folder_match_the_full_load(folder):
    """iter_weights and shard= address a tensor's bytes in its own row-major order, so a DCP
    tensor saved in chunks (dim 0 and dim 1 across two ranks) must come back the same through
    them as through load_checkpoint."""
    full = ferry.load_checkpoint(DATA / folder, device="cpu")
    streamed = dict(ferry.iter_weights(DATA / folder, device="cpu"))
    assert sorted(streamed) == sorted(full)
    for name, t in full.items():
        assert torch.equal(streamed[name], t), name
    two_d = [n for n, t in full.items() if t.dim() == 2 and t.shape[0] >= 2 and t.shape[1] >= 2]
    assert two_d
    for dim in (0, 1):
        for rank in (0, 1):
            rule = {n: ferry.Shard(dim=dim, rank=rank, world=2) for n in two_d}
            part = ferry.load_checkpoint(DATA / folder, device="cpu", shard=rule)
            for n in two_d:
                want = torch.tensor_split(full[n], 2, dim=dim)[rank]
                assert torch.equal(part[n], want), (n, dim, rank)


@pytest.mark.parametrize("folder", ["single", "two_ranks"])
def test_the_load_report_lists_the_byte_items_it_skipped(folder):
    ferry.load_checkpoint(DATA / folder, device="cpu")
    report = ferry.last_load_report()
    assert sorted(report.skipped) == sorted(k for k, v in EXPECTED[folder].items() if "value" in v)
    assert json.loads(report.to_json())["skipped"] == report.skipped


def test_a_slice_of_chunked_tensors_reads_only_its_bytes():
    """Issue 51 item 3: tensors two ranks saved in chunks, loaded as one rank's slice along the
    other dimension, read at most 1.05x the slice's bytes; a whole load reads its tensors' bytes,
    and opening reads .metadata and one region per .distcp file (tests/data/dcp's blobs are small)."""
    full = ferry.load_checkpoint(DATA / "two_ranks", device="cpu")
    whole = ferry.last_load_report()
    assert whole.bytes_read == sum(t.numel() * t.element_size() for t in full.values())
    assert whole.open_reads == 1 + len(list((DATA / "two_ranks").glob("*.distcp")))
    report = json.loads(whole.to_json())
    assert (report["bytes_read"], report["open_reads"]) == (whole.bytes_read, whole.open_reads)
    two_d = [n for n, t in full.items() if t.dim() == 2]
    it = ferry.iter_weights(DATA / "two_ranks", device="cpu", names=two_d,
                            shard=ferry.Shard(dim=1, rank=1, world=2))
    for name, t in it:
        assert torch.equal(t, torch.tensor_split(full[name], 2, dim=1)[1]), name
    asked = it.report.bytes_read
    read = sum(load.bytes_read for load in it.report.loads)
    assert asked == sum(full[n].numel() * full[n].element_size() // 2 for n in two_d)
    assert asked <= read <= 1.05 * asked
