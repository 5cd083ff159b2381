"""ferry.torch.save and ferry.torch.load (issue 51 item 7) against the torch here (Debian's 1.13
in CI): ferry's files load bit-exact with stock torch.load(weights_only=True), ferry loads stock
files, storages stay shared, records are aligned, saves are crash-safe, and bad files and
objects get errors naming the file, the offset, the class or the key path."""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from collections import OrderedDict

import pytest

torch = pytest.importorskip("torch")

import ferry  # noqa: E402
import ferry.torch as ftorch  # noqa: E402


def _state():
    g = torch.Generator().manual_seed(51)
    w = torch.randn(64, 80, generator=g)
    base = torch.arange(24, dtype=torch.int64)
    return OrderedDict([
        ("layer.w", w),
        ("layer.w_t", w.t()),                        # a transposed view of the same storage
        ("tied", w),                                  # tied weights: the same tensor twice
        ("slice", base[5:17].view(3, 4)),            # a view at a storage offset
        ("base", base),
        ("bf16", torch.randn(33, generator=g).to(torch.bfloat16)),
        ("fp16", torch.randn(2, 3, generator=g).to(torch.float16)),
        ("mask", torch.rand(9, generator=g) > 0.5),
        ("int8", torch.arange(-5, 5, dtype=torch.int8)),
        ("scalar", torch.tensor(2.5)),
        ("empty", torch.empty(0, 7)),
        ("big", torch.randn(3000, generator=g)),     # over 4096 B: its record is 4096-aligned
        ("meta", {"step": 7, "lr": 1e-3, "name": "adamw", "betas": (0.9, 0.95), "flag": True,
                  "none": None, "ids": [1, 2, 3]}),
    ])


def _same(a, b):
    """Equal values, tensors bit-exact with the same dtype, shape, stride and storage offset."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        return
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def _stock_load(path):
    """Stock torch.load(weights_only=True); torch 1.13's weights-only unpickler lacks BINFLOAT (a
    float value anywhere, in stock files too), where the float-free tests still use it."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        if "Unsupported operand 71" not in str(e) or not torch.__version__.startswith("1."):
            raise
        return torch.load(path, weights_only=False)


def _storage_ptr(t):
    return t.storage().data_ptr()


def _optimizer_state():
    g = torch.Generator().manual_seed(7)
    model = torch.nn.Linear(16, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 16, generator=g)).sum().backward()
    opt.step()
    return opt.state_dict()


def test_ferry_files_load_bit_exact_with_stock_torch_load(tmp_path):
    state = _state()
    report = ftorch.save(state, tmp_path / "s.pt")
    back = _stock_load(tmp_path / "s.pt")
    _same(state, back)
    # One record per storage: views and tied weights share theirs, as torch.save writes them.
    assert _storage_ptr(back["layer.w"]) == _storage_ptr(back["layer.w_t"])
    assert back["tied"].data_ptr() == back["layer.w"].data_ptr()
    assert _storage_ptr(back["slice"]) == _storage_ptr(back["base"])
    names = zipfile.ZipFile(tmp_path / "s.pt").namelist()
    assert len([n for n in names if "/data/" in n]) == 9
    assert report.bytes == os.path.getsize(tmp_path / "s.pt")
    assert report.fsyncs == 2 and report.routes and report.files == [str(tmp_path / "s.pt")]
    assert ftorch.last_report() is report


def test_optimizer_state_round_trips_both_ways(tmp_path):
    state = _optimizer_state()
    ftorch.save(state, tmp_path / "optimizer.pt")
    _same(state, _stock_load(tmp_path / "optimizer.pt"))
    _same(state, ftorch.load(tmp_path / "optimizer.pt"))
    torch.save(state, tmp_path / "stock.pt")
    _same(state, ftorch.load(tmp_path / "stock.pt"))


def test_ferry_load_reads_stock_files_and_keeps_storages_shared(tmp_path):
    state = _state()
    torch.save(state, tmp_path / "stock.pt")
    back = ftorch.load(tmp_path / "stock.pt", map_location="cpu")
    _same(state, back)
    assert _storage_ptr(back["layer.w"]) == _storage_ptr(back["layer.w_t"])
    assert _storage_ptr(back["slice"]) == _storage_ptr(back["base"])
    report = ftorch.last_report()
    assert report.bytes == sum(v.storage().nbytes() for k, v in state.items()
                               if k in ("layer.w", "base", "bf16", "fp16", "mask", "int8",
                                        "scalar", "big"))
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    torch.save(model.state_dict(), tmp_path / "model.pt")
    back = ftorch.load(tmp_path / "model.pt")
    _same(model.state_dict(), back)
    assert back._metadata == model.state_dict()._metadata  # what load_state_dict reads
    model.load_state_dict(back)


def test_parameters_round_trip_as_parameters(tmp_path):
    p = torch.nn.Parameter(torch.randn(5, 3))
    ftorch.save({"p": p, "list": [p]}, tmp_path / "p.pt")
    for back in (torch.load(tmp_path / "p.pt", weights_only=True), ftorch.load(tmp_path / "p.pt")):
        assert type(back["p"]) is torch.nn.Parameter and back["p"].requires_grad
        assert torch.equal(back["p"], p) and back["list"][0].data_ptr() == back["p"].data_ptr()


def test_large_storages_start_4096_aligned(tmp_path):
    ftorch.save({"a": torch.randn(5000), "b": torch.randn(1100), "c": torch.ones(3)},
                tmp_path / "a.pt")
    ftorch.save({"a": torch.randn(5000)}, tmp_path / "b.pt", alignment=64)
    for name, want in (("a.pt", {1100 * 4: 4096, 5000 * 4: 4096, 12: 64}), ("b.pt", {20000: 64})):
        with open(tmp_path / name, "rb") as f:
            for info in zipfile.ZipFile(f).infolist():
                if "/data/" not in info.filename:
                    continue
                f.seek(info.header_offset + 26)
                n, extra = struct.unpack("<HH", f.read(4))
                assert (info.header_offset + 30 + n + extra) % want[info.file_size] == 0


def test_mmap_gives_tensors_over_a_private_mapping(tmp_path):
    state = _state()
    ftorch.save(state, tmp_path / "m.pt")
    before = (tmp_path / "m.pt").read_bytes()
    back = ftorch.load(tmp_path / "m.pt", mmap=True)
    _same(state, back)
    back["big"].add_(1)  # private: the file does not change
    del back
    assert (tmp_path / "m.pt").read_bytes() == before
    with pytest.raises(ValueError, match="mmap=True maps"):
        ftorch.load(tmp_path / "m.pt", mmap=True, map_location="meta")


def test_unsupported_objects_name_their_key_path_and_leave_the_file(tmp_path):
    class MyObj:
        pass

    target = tmp_path / "keep.pt"
    target.write_bytes(b"old")
    with pytest.raises(TypeError, match=r"obj\['state'\]\[0\]\['foo'\] is a <class .*MyObj'>: "
                                        r"ferry.torch.save writes tensors and plain containers"):
        ftorch.save({"state": {0: {"foo": MyObj()}}}, target)
    with pytest.raises(TypeError, match="view one storage as different types"):
        w = torch.zeros(4)
        ftorch.save({"a": w, "b": w.view(torch.int32)}, target)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["keep.pt"]


def test_a_failed_save_names_the_path_and_leaves_nothing(tmp_path):
    (tmp_path / "plain").write_bytes(b"a file, not a folder")
    with pytest.raises(OSError, match=str(tmp_path / "plain" / "x.pt")):
        ftorch.save({"a": torch.ones(3)}, tmp_path / "plain" / "x.pt")
    assert sorted(os.listdir(tmp_path)) == ["plain"]


def test_bad_files_name_the_file_and_the_offset(tmp_path):
    ftorch.save(_state(), tmp_path / "s.pt")
    data = (tmp_path / "s.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(ferry.CheckpointError, match=r"cut\.pt.*offset \d+.*(zip end record|trunc)"):
        ftorch.load(tmp_path / "cut.pt")

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps({"x": Evil()}, protocol=2))
        z.writestr("archive/version", "3\n")
    (tmp_path / "evil.pt").write_bytes(buf.getvalue())
    with pytest.raises(ferry.CheckpointError,
                       match=r"evil\.pt.*pickle offset \d+: refuses class (posix|os)\.system"):
        ftorch.load(tmp_path / "evil.pt")

    with zipfile.ZipFile(tmp_path / "other.zip", "w") as z:
        z.writestr("hello.txt", "hi")
    with pytest.raises(ferry.CheckpointError, match=r"other\.zip.*no data.pkl"):
        ftorch.load(tmp_path / "other.zip")

    torch.save({"a": torch.ones(2)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(ferry.CheckpointError,
                       match=r"legacy\.pt.*_use_new_zipfile_serialization=False"):
        ftorch.load(tmp_path / "legacy.pt")


def test_weights_only_false_and_file_objects_go_to_torch(tmp_path):
    torch.save({"a": torch.ones(2), "f": len}, tmp_path / "obj.pt")
    assert ftorch.load(tmp_path / "obj.pt", weights_only=False)["f"] is len
    with pytest.raises(ferry.CheckpointError, match=r"obj\.pt: pickle offset \d+: refuses class (__builtin__|builtins)\.len"):
        ftorch.load(tmp_path / "obj.pt")
    buf = io.BytesIO()
    ftorch.save({"a": torch.arange(3)}, buf)
    buf.seek(0)
    assert torch.equal(ftorch.load(buf)["a"], torch.arange(3))


def test_save_reports_progress(tmp_path):
    calls = []
    ftorch.save({"a": torch.randn(1 << 16)}, tmp_path / "p.pt",
                progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1][0] == calls[-1][1] == os.path.getsize(tmp_path / "p.pt")


@pytest.mark.gpu
def test_cuda_tensors_save_and_load_on_the_gpu(torch, tmp_path):
    state = _state()
    gpu = OrderedDict((k, v.to("cuda:0") if isinstance(v, torch.Tensor) else v)
                      for k, v in state.items())
    gpu["layer.w_t"] = gpu["layer.w"].t()
    ftorch.save(gpu, tmp_path / "g.pt")
    stock = torch.load(tmp_path / "g.pt", weights_only=True)
    assert stock["layer.w"].device == torch.device("cuda:0")
    back = ftorch.load(tmp_path / "g.pt", map_location="cuda:0")
    for k, v in state.items():
        if isinstance(v, torch.Tensor):
            assert back[k].device == torch.device("cuda:0")
            assert torch.equal(back[k].cpu(), v.cpu() if k != "layer.w_t" else state["layer.w"].t())
    torch.save(state, tmp_path / "c.pt")
    back = ftorch.load(tmp_path / "c.pt", map_location={"cpu": "cuda:0"})
    assert back["big"].is_cuda and torch.equal(back["big"].cpu(), state["big"])
