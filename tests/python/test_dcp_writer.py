"""ferry's DCP writing core from Python (issue 51 items 1 and 4), without torch's DCP module:
each item's torch.save blob, written by C++ around the tensor's own bytes, loads bit-exact with
this torch's stock torch.load(weights_only=True); byte items land as they are; and where
torch.distributed.checkpoint is absent, `import ferry.dcp` says why in one line. The stock
conformance tests (torch 2.x) are in test_dcp_stock.py."""
import io
import subprocess
import sys

import pytest

from ferry import _ferry

torch = pytest.importorskip("torch")

_FMT = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64",
        torch.bool: "BOOL", torch.uint8: "U8", torch.float64: "F64", torch.int32: "I32"}


def _row(name, t):
    nbytes = t.numel() * t.element_size()
    return (name, _FMT[t.dtype], tuple(t.shape), t.data_ptr() if nbytes else 0, nbytes)


def _tensors():
    g = torch.Generator().manual_seed(51)
    view = torch.randn(6, 9, generator=g)[:, ::2].t()  # non-contiguous: written contiguous
    return {
        "bf16": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "fp16": torch.randn(5000, generator=g).to(torch.float16),  # over 4096 B: 4096-aligned
        "fp32": torch.randn(4, 3, 2, generator=g),
        "int64": torch.arange(-5, 12, dtype=torch.int64),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "bool": torch.tensor([True, False, True]),
        "view": view.contiguous(),
    }


def test_each_blob_loads_bit_exact_with_stock_torch_load(tmp_path):
    tensors = _tensors()
    rows = [_row(k, v) for k, v in tensors.items()]
    rows.insert(2, ("optim.param_groups", b"\x80\x04 pickled bytes, as DCP hands them"))
    path = tmp_path / "__0_0.test.distcp"
    places, _ = _ferry.dcp_write_file(rows, str(path))
    data = path.read_bytes()
    assert len(places) == len(rows)
    for row, (offset, length) in zip(rows, places):
        blob = data[offset:offset + length]
        if len(row) == 2:
            assert blob == row[1]
            continue
        want = tensors[row[0]]
        got = torch.load(io.BytesIO(blob), weights_only=True)
        assert got.dtype == want.dtype and got.shape == want.shape, row[0]
        assert torch.equal(got, want), row[0]
        assert got.is_contiguous()
    assert places[-1][0] + places[-1][1] == len(data)


def test_a_rank_file_and_the_commit_report_bytes_fsyncs_routes_and_progress(tmp_path):
    tensors = _tensors()
    rows = [_row(k, v) for k, v in tensors.items()] + [("step", b"\x80\x04K\x07.")]
    folder = tmp_path / "ckpt"
    lock = _ferry.DcpSaveLock(str(folder))
    seen = []
    places, report = _ferry.dcp_write_file(rows, str(folder / "__0_0.s.distcp"),
                                           progress=lambda done, total: seen.append((done, total)))
    size = (folder / "__0_0.s.distcp").stat().st_size
    assert report.files == [str(folder / "__0_0.s.distcp")]
    assert report.bytes == size == places[-1][0] + places[-1][1]
    assert report.tensors == len(tensors) and report.fsyncs == 2 and report.seconds > 0
    assert report.routes and all(r.bytes > 0 for r in report.routes), report.summary()
    assert seen and seen[-1] == (size, size)  # the last call: every byte
    (folder / "__0_0.old.distcp").write_bytes(b"a file of an older save")
    commit = _ferry.dcp_commit(str(folder), b"metadata", ["__0_0.s.distcp"])
    assert commit.files == [str(folder / ".metadata")] and commit.bytes == len(b"metadata")
    assert commit.fsyncs == 3  # .metadata, the folder after the rename, again after the removal
    assert not (folder / "__0_0.old.distcp").exists()
    _, quiet = _ferry.dcp_write_file(rows[:1], str(folder / "__0_0.t.distcp"), durable=False)
    assert quiet.fsyncs == 0
    del lock


def test_a_tensor_over_4096_bytes_starts_4096_aligned_in_the_file(tmp_path):
    t = torch.arange(3000, dtype=torch.int64)
    path = tmp_path / "__0_0.a.distcp"
    _ferry.dcp_write_file([("pad", b"x" * 13), _row("t", t)], str(path))
    data = path.read_bytes()
    at = data.find(t.numpy().tobytes())
    assert at > 0 and at % 4096 == 0


def test_a_dtype_torch_save_cannot_name_is_refused_naming_the_tensor(tmp_path):
    path = tmp_path / "__0_0.b.distcp"
    buf = torch.zeros(4, dtype=torch.uint8)
    with pytest.raises(ValueError, match="model.fp8"):
        _ferry.dcp_write_file([("model.fp8", "F8_E4M3", (4,), buf.data_ptr(), 4)], str(path))
    assert not path.exists()


def test_a_second_writer_is_refused(tmp_path):
    first = _ferry.DcpSaveLock(str(tmp_path / "ckpt"))
    with pytest.raises(OSError, match="a second writer is refused"):
        _ferry.DcpSaveLock(str(tmp_path / "ckpt"))
    del first
    _ferry.DcpSaveLock(str(tmp_path / "ckpt"))


def _has_dcp():
    try:
        import torch.distributed.checkpoint  # noqa: F401
        return True
    except Exception:
        return False


@pytest.mark.skipif(_has_dcp(), reason="this torch has torch.distributed.checkpoint")
def test_import_without_dcp_says_why_in_one_line():
    r = subprocess.run([sys.executable, "-c", "import ferry.dcp"], capture_output=True, text=True)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ferry.dcp needs torch.distributed.checkpoint"), r.stderr
    assert torch.__version__ in last
