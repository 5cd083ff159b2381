"""ferry.safetensors and ferry.load_checkpoint against files from this test's own writer, built
from the format description (8-byte little-endian header length, JSON header, data): every
dtype, empty tensors, scalars, __metadata__, sharded indexes, hostile headers, and NumPy output
byte for byte. Torch cases run where torch is installed (CPU is enough) and skip otherwise."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import threading

import numpy as np
import pytest

import ferry
from ferry.safetensors import SafetensorError, safe_open
from ferry.safetensors.numpy import load_file as np_load_file

# dtype -> (bits per element, numpy dtype ferry returns)
DTYPES = {
    "BOOL": (8, np.bool_), "U8": (8, np.uint8), "I8": (8, np.int8), "U16": (16, np.uint16),
    "I16": (16, np.int16), "F16": (16, np.float16), "BF16": (16, np.uint16),
    "U32": (32, np.uint32), "I32": (32, np.int32), "F32": (32, np.float32),
    "U64": (64, np.uint64), "I64": (64, np.int64), "F64": (64, np.float64),
    "C64": (64, np.complex64), "F8_E4M3": (8, np.uint8), "F8_E5M2": (8, np.uint8),
    "F8_E8M0": (8, np.uint8), "F6_E2M3": (6, np.uint8), "F6_E3M2": (6, np.uint8),
    "F4": (4, np.uint8),
}
PACKED = {"F4", "F6_E2M3", "F6_E3M2"}


def encode(tensors, metadata=None):
    """The bytes of a safetensors file holding `tensors` [(name, dtype, shape, bytes)], in the
    order given, the header padded with spaces to a multiple of 8."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(t[3] for t in tensors)


def raw_file(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def rng_bytes(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def every_dtype():
    out = []
    for i, (dtype, (bits, _)) in enumerate(DTYPES.items()):
        shape = (2, 4)  # 8 elements: whole bytes for the 4- and 6-bit kinds too
        data = rng_bytes(8 * bits // 8, i)
        if dtype == "BOOL":
            data = bytes(b & 1 for b in data)
        out.append((f"t.{dtype}", dtype, shape, data))
    out += [("scalar", "F32", (), rng_bytes(4, 99)), ("empty", "F16", (0, 3), b""),
            ("empty.bf16", "BF16", (4, 0), b"")]
    return out


@pytest.fixture
def mixed(tmp_path):
    tensors = every_dtype()
    path = tmp_path / "model.safetensors"
    path.write_bytes(encode(tensors, {"format": "pt", "who": "test"}))
    return str(path), tensors


def check_numpy(arrays, tensors):
    assert set(arrays) == {t[0] for t in tensors}
    for name, dtype, shape, data in tensors:
        a = arrays[name]
        assert a.dtype == DTYPES[dtype][1], name
        assert a.shape == ((len(data),) if dtype in PACKED else tuple(shape)), name
        assert a.tobytes() == data, name
        assert a.flags.c_contiguous and a.flags.writeable


@pytest.mark.parametrize("route", ["read", "map"])
def test_numpy_load_file_is_byte_for_byte(mixed, route):
    path, tensors = mixed
    with ferry.settings(host_load=route):
        check_numpy(np_load_file(path), tensors)
    report = ferry.last_load_report()
    assert report.bytes == sum(len(t[3]) for t in tensors)
    assert [r.path for r in report.host_routes] == ["read" if route == "read" else "mapped"]
    # One gathered request for the shard; mapped, every tensor here is aligned: none.
    assert len(report.routes) == (1 if route == "read" else 0)


def root(a):
    while a.base is not None:
        a = a.base
    return id(a)


def test_tensors_are_independent_unless_one_allocation_is_asked(mixed):
    path, tensors = mixed
    with ferry.settings(host_load="read"):  # mapped, they are views of one mapping
        arrays = np_load_file(path)
        shared = np_load_file(path, one_allocation=True)
    assert len({root(a) for a in arrays.values()}) == len(arrays)
    check_numpy(shared, tensors)
    assert len({root(a) for a in shared.values()}) == 1


def test_safe_open_keys_metadata_tensors_and_slices(mixed):
    path, tensors = mixed
    with safe_open(path, framework="numpy") as f:
        assert f.keys() == sorted(t[0] for t in tensors)
        assert f.offset_keys() == [t[0] for t in tensors]
        assert f.metadata() == {"format": "pt", "who": "test"}
        full = f.get_tensor("t.F32")
        assert full.tobytes() == tensors[9][3]
        s = f.get_slice("t.F32")
        assert s.get_shape() == [2, 4] and s.get_dtype() == "F32"
        for index in [slice(None), 1, -1, slice(0, 1), (slice(None), slice(1, 3)), (1, 2),
                      slice(None, None, 2), slice(None, None, -1), Ellipsis, (Ellipsis, 0),
                      slice(5, 9)]:
            np.testing.assert_array_equal(s[index], full[index], err_msg=repr(index))
        assert s[:, 1:3].flags.c_contiguous
        with pytest.raises(IndexError):
            s[2]
        np.testing.assert_array_equal(f.get_slice("scalar")[()], f.get_tensor("scalar"))
        assert f.get_slice("empty")[0:0].shape == (0, 3)
        with pytest.raises(ferry.CheckpointError, match="'nope'"):
            f.get_tensor("nope")


def test_safe_open_without_metadata_says_none(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode([("w", "U8", (2,), b"ab")]))
    with safe_open(str(path), framework="np") as f:
        assert f.metadata() is None
        assert f.get_tensor("w").tobytes() == b"ab"


def write_sharded(directory, shards, index_name="model.safetensors.index.json"):
    weight_map = {}
    for i, tensors in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        (directory / name).write_bytes(encode(tensors))
        weight_map.update({t[0]: name for t in tensors})
    total = sum(len(t[3]) for s in shards for t in s)
    (directory / index_name).write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))


def shards_of(n):
    return [[(f"layers.{s}.{k}.weight", "F32" if k % 2 else "BF16", (3, k + 1),
              rng_bytes((4 if k % 2 else 2) * 3 * (k + 1), 10 * s + k)) for k in range(5)]
            for s in range(n)]


def test_sharded_index_and_directory_load_every_shard(tmp_path):
    shards = shards_of(3)
    write_sharded(tmp_path, shards)
    everything = [t for s in shards for t in s]
    for target in (tmp_path / "model.safetensors.index.json", tmp_path, str(tmp_path)):
        arrays = ferry.load_checkpoint(target, framework="numpy")
        check_numpy(arrays, everything)
        assert len(ferry.last_load_report().routes) == 3
    ckpt = ferry.checkpoint.Checkpoint(tmp_path)
    assert len(ckpt.shards) == 3
    assert ckpt.index_metadata["total_size"] == sum(len(t[3]) for t in everything)
    some = ckpt.load("numpy", names=["layers.2.4.weight", "layers.0.0.weight"])
    assert list(some) == ["layers.0.0.weight", "layers.2.4.weight"]  # file order


def test_read_into_reads_named_ranges_into_memory_the_caller_allocated(tmp_path):
    # Issue 46: ferry.distributed read its pieces through ckpt._c, the C++ object behind it.
    shards = shards_of(2)
    write_sharded(tmp_path, shards)
    name, _, _, data = shards[1][2]
    ckpt = ferry.checkpoint.Checkpoint(tmp_path)
    whole, part = np.zeros(len(data), np.uint8), np.zeros(3, np.uint8)
    report = ckpt.read_into([(name, whole), (name, part, 2, 3)])
    assert whole.tobytes() == data and part.tobytes() == data[2:5]
    assert report.bytes == len(data) + 3 and len(report.routes) == 1
    assert ferry.last_load_report().bytes == report.bytes
    with pytest.raises(ferry.CheckpointError, match="'layers.9.weight': no such tensor"):
        ckpt.read_into([("layers.9.weight", whole)])


@pytest.mark.parametrize("host", [False, True])
def test_the_cpp_loader_reads_what_this_thread_allocates(tmp_path, monkeypatch, host):
    # Issue 46: Python had a scheduler of its own beside C++'s Checkpoint::load (parts, 4 in
    # flight, its constants copied), so benchmarking `ferry load` measured another loader. Now
    # Checkpoint::load asks for each tensor's memory from the calling thread (torch's CUDA
    # allocator is per thread), GPU memory a part at a time, host memory all first.
    shards = shards_of(3)
    write_sharded(tmp_path, shards)
    everything = [t for s in shards for t in s]
    ckpt = ferry.checkpoint.Checkpoint(tmp_path)
    fw = ferry.checkpoint._framework("numpy", "cpu")
    fw.host = host
    threads = []
    real_raw = fw.raw
    monkeypatch.setattr(fw, "raw", lambda n: threads.append(threading.get_ident()) or real_raw(n))
    monkeypatch.setattr(ferry.checkpoint, "_framework", lambda *_: fw)
    with ferry.settings(host_load="read"):  # the files are resident: they would be mapped
        check_numpy(ckpt.load("numpy"), everything)
    assert threads == [threading.get_ident()] * 15
    report = ferry.last_load_report()
    assert len(report.routes) == 3  # one part a shard: each under 1 GiB
    assert report.tensors == 15
    assert report.bytes == sum(len(t[3]) for t in everything)
    assert 0 < report.allocate_seconds < report.seconds


@pytest.mark.parametrize("host", [False, True])
def test_a_failed_allocation_waits_for_the_reads_it_started_and_raises(tmp_path, monkeypatch,
                                                                      host):
    # GPU memory is allocated a part at a time, the first part's read running meanwhile;
    # pageable host memory all before any read. Checkpoint::load waits for the reads in flight
    # before the error reaches Python, which may then free what it allocated.
    shards = shards_of(2)
    write_sharded(tmp_path, shards)
    ckpt = ferry.checkpoint.Checkpoint(tmp_path)
    fw = ferry.checkpoint._framework("numpy", "cpu")
    fw.host = host
    made = []
    real_raw = fw.raw

    def raw(nbytes):
        if len(made) == 7:  # the second shard's third tensor
            raise MemoryError("no room for tensor 8")
        made.append(real_raw(nbytes))
        return made[-1]

    monkeypatch.setattr(fw, "raw", raw)
    with pytest.raises(MemoryError, match="tensor 8"), ferry.settings(host_load="read"):
        ckpt._allocate_and_read(fw, list(ckpt.entries.values()), False, None)
    assert len(made) == 7
    if not host:  # the first shard's read had started, and had finished
        assert [m.tobytes() for m in made[:5]] == [t[3] for t in shards[0]]
    made.clear()
    monkeypatch.setattr(fw, "raw", real_raw)
    check_numpy(ckpt.load("numpy"), [t for s in shards for t in s])


def test_an_index_that_disagrees_with_its_shards_is_refused(tmp_path):
    shards = shards_of(2)
    write_sharded(tmp_path, shards)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ferry.CheckpointError) as e:
        ferry.load_checkpoint(tmp_path, framework="numpy")
    assert e.value.tensor == "ghost"
    del index["weight_map"]["ghost"]
    index["weight_map"]["layers.0.0.weight"] = "missing.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ferry.CheckpointError, match="does not exist"):
        ferry.load_checkpoint(tmp_path, framework="numpy")


ENTRY = '{"dtype":"U8","shape":[4],"data_offsets":[0,4]}'
HOSTILE = [
    ("length past the file", struct.pack("<Q", 1000) + b"{}", "", "runs past the end"),
    ("length over the cap", struct.pack("<Q", 1 << 40) + b"{}", "", "above the"),
    ("too short", b"\x01\x02", "", "too short"),
    ("not JSON", raw_file(b'{"a": '), "", "not valid JSON"),
    ("unknown dtype", raw_file(b'{"w":{"dtype":"F7","shape":[4],"data_offsets":[0,4]}}', b"abcd"),
     "w", "unknown dtype"),
    ("shape and range disagree",
     raw_file(b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', b"abcd"), "w", "8 B"),
    ("outside the data",
     raw_file(b'{"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}', b"abcd"), "w",
     "past the data section"),
    ("overlap", raw_file(('{"a":' + ENTRY + ',"b":{"dtype":"U8","shape":[4],'
                          '"data_offsets":[2,6]}}').encode(), b"abcdef"), "b", "overlap"),
    ("duplicate name", raw_file(('{"w":' + ENTRY + ',"w":' + ENTRY + '}').encode(), b"abcd"),
     "w", "twice"),
    ("hole", raw_file(b'{"w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}', b"abcd"), "w",
     "hole"),
    ("metadata not strings", raw_file(b'{"__metadata__":{"a":1}}'), "", "not a string"),
]


@pytest.mark.parametrize("what,data,tensor,words", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_headers_are_clear_errors(tmp_path, what, data, tensor, words):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(SafetensorError) as e:
        np_load_file(str(path))
    assert isinstance(e.value, ValueError) and isinstance(e.value, ferry.Error)
    assert str(path) in str(e.value) and e.value.filename == str(path)
    assert e.value.tensor == tensor
    assert words in str(e.value)


def test_numpy_refuses_a_gpu_device(mixed):
    with pytest.raises(ValueError, match="host memory"):
        ferry.load_checkpoint(mixed[0], framework="numpy", device="cuda:0")
    with pytest.raises(ValueError, match="framework"):
        ferry.load_checkpoint(mixed[0], framework="tf")


def test_dtype_converts_floating_tensors_only(mixed):
    arrays = ferry.load_checkpoint(mixed[0], framework="numpy", dtype=np.float64)
    assert arrays["t.F32"].dtype == np.float64 and arrays["t.I32"].dtype == np.int32
    assert arrays["t.F16"].dtype == np.float64


def _no_reads(monkeypatch):
    """Makes any read of a checkpoint fail the test: what is refused must be refused first."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("a read started before the request was refused")
    monkeypatch.setattr(ferry.checkpoint.Checkpoint, "_allocate_and_read", refuse)


@pytest.mark.parametrize("dtype", [np.int8, "int32", "uint8", "no-such-type", "bfloat16"])
def test_numpy_dtype_is_checked_before_any_read(mixed, monkeypatch, dtype):
    # Issue 29: dtype=int8 cast every weight to int8; "bfloat16" failed after the whole read.
    _no_reads(monkeypatch)
    with pytest.raises(TypeError, match=r"dtype=") as e:
        ferry.load_checkpoint(mixed[0], framework="numpy", dtype=dtype)
    if dtype == "bfloat16":
        assert "NumPy has no bfloat16" in str(e.value)


def test_numpy_has_no_bfloat16_also_where_ml_dtypes_registered_one(mixed, monkeypatch,
                                                                    numpy_with_bfloat16):
    """Seen on the GPU machine with ml_dtypes imported first (pytest -p ml_dtypes):
    numpy.dtype("bfloat16") is its registered dtype (kind 'V'), and the hint gave way to "only
    floating-point tensors are converted"."""
    _no_reads(monkeypatch)
    for dtype in ("bfloat16", numpy_with_bfloat16):
        with pytest.raises(TypeError, match=r"dtype=.* is not a NumPy dtype") as e:
            ferry.load_checkpoint(mixed[0], framework="numpy", dtype=dtype)
        if isinstance(dtype, str):
            assert "NumPy has no bfloat16" in str(e.value)


@pytest.mark.parametrize("dtype", ["float32", "numpy.float32", "fp32", np.float32,
                                   np.dtype("float32")])
def test_numpy_dtype_converts_bf16_and_f8_bits_too(tmp_path, dtype):
    # NumPy holds BF16 and F8 as raw bits; dtype= must convert their values, not skip them.
    values = np.array([1.0, -2.5, 0.15625, 448.0], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    # float8_e4m3fn: 1.0 = 0x38, -2.5 = 0xC2, 0.15625 = 0x22, 448 = 0x7E (its largest)
    e4m3 = np.array([0x38, 0xC2, 0x22, 0x7E], dtype=np.uint8)
    # float8_e5m2: 1.0 = 0x3C, -2.5 = 0xC1, 0.15625 = 0x31, +inf = 0x7C
    e5m2 = np.array([0x3C, 0xC1, 0x31, 0x7C], dtype=np.uint8)
    path = tmp_path / "f.safetensors"
    path.write_bytes(encode([("bf", "BF16", (4,), bf16.tobytes()),
                             ("e4", "F8_E4M3", (4,), e4m3.tobytes()),
                             ("e5", "F8_E5M2", (4,), e5m2.tobytes()),
                             ("i", "I32", (1,), np.int32(7).tobytes())]))
    arrays = ferry.load_checkpoint(path, framework="numpy", dtype=dtype)
    for name in ("bf", "e4"):
        assert arrays[name].dtype == np.float32, name
        assert np.array_equal(arrays[name], values), (name, arrays[name])
    assert np.array_equal(arrays["e5"], np.array([1.0, -2.5, 0.15625, np.inf], np.float32))
    assert arrays["i"].dtype == np.int32 and arrays["i"][0] == 7


def test_f8_tables_decode_every_code_as_ieee_rules_say():
    from ferry.checkpoint import _f8_table
    e4 = _f8_table(np, "F8_E4M3")
    assert e4[0x00] == 0 and e4[0x01] == 2.0 ** -9 and e4[0x08] == 2.0 ** -6
    assert np.isnan(e4[0x7F]) and np.isnan(e4[0xFF]) and e4[0xFE] == -448
    assert np.isfinite(np.delete(e4, [0x7F, 0xFF])).all()
    e5 = _f8_table(np, "F8_E5M2")
    assert e5[0x7B] == 57344 and e5[0xFC] == -np.inf and np.isnan(e5[0x7D])
    assert e5[0x01] == 2.0 ** -16
    e8 = _f8_table(np, "F8_E8M0")
    assert e8[127] == 1 and e8[0] == 2.0 ** -127 and np.isnan(e8[255])


def test_cli_load_reports_tensors_bytes_and_route(mixed):
    cli = os.environ.get("FERRY_CLI")
    if not cli:
        pytest.skip("FERRY_CLI is not set")
    path, tensors = mixed
    out = subprocess.run([cli, "load", path, "--host", "--json", "--list", "--host-load", "read"],
                         check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    assert report["tensors"] == len(tensors)
    assert report["bytes"] == sum(len(t[3]) for t in tensors)
    assert report["memory"] == "host" and len(report["routes"]) == 1
    assert report["host_routes"][0]["reason"] == "host_load=read"
    assert {t["name"] for t in report["tensor_list"]} == {t[0] for t in tensors}
    text = subprocess.run([cli, "load", path, "--host"], check=True, capture_output=True,
                          text=True).stdout
    assert f"loaded {len(tensors)} tensors" in text and "GB/s" in text and "route" in text
    bad = subprocess.run([cli, "load", str(path) + ".missing"], capture_output=True, text=True)
    assert bad.returncode != 0 and "no such file" in bad.stderr


# --------------------------------------------------------------------------------- torch


@pytest.fixture
def cpu_torch():
    return pytest.importorskip("torch")


def test_torch_load_file_matches_numpy_bits(cpu_torch, mixed):
    torch = cpu_torch
    from ferry.safetensors.torch import load_file
    path, tensors = mixed
    names = [t[0] for t in tensors if not hasattr(torch, "uint16") and t[1] in ("U16", "U32",
                                                                               "U64")]
    names += [t[0] for t in tensors if not hasattr(torch, "float8_e8m0fnu") and
              t[1].startswith("F8")]
    if names:  # an older torch lacks these dtypes: they are refused with the tensor's name
        with pytest.raises(TypeError, match="has no dtype"):
            load_file(path)
    wanted = [t for t in tensors if t[0] not in names]
    ckpt = ferry.checkpoint.Checkpoint(path)
    loaded = ckpt.load("pt", "cpu", names=[t[0] for t in wanted])
    for name, dtype, shape, data in wanted:
        t = loaded[name]
        assert t.device.type == "cpu"
        assert tuple(t.shape) == ((len(data),) if dtype in PACKED else tuple(shape)), name
        raw = t.reshape(-1).view(torch.uint8) if t.numel() and t.element_size() == 1 else t
        as_bytes = raw.contiguous().numpy().tobytes() if dtype != "BF16" else \
            t.view(torch.int16).numpy().tobytes()
        assert as_bytes == data, name
    bf = loaded["t.BF16"]
    assert bf.dtype == torch.bfloat16
    converted = ckpt.load("pt", "cpu", names=["t.BF16", "t.I32"], dtype=torch.float32)
    assert converted["t.BF16"].dtype == torch.float32
    assert torch.equal(converted["t.BF16"], bf.float())
    assert converted["t.I32"].dtype == torch.int32


@pytest.mark.parametrize("dtype", ["int8", "torch.int8", "float99", np.int16])
def test_torch_dtype_is_checked_before_any_read(cpu_torch, mixed, monkeypatch, dtype):
    from ferry.safetensors.torch import load_file
    _no_reads(monkeypatch)
    if isinstance(dtype, str) and dtype.endswith("int8"):
        dtype = cpu_torch.int8 if dtype == "torch.int8" else dtype
    with pytest.raises(TypeError, match=r"dtype="):
        load_file(mixed[0], dtype=dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "torch.bfloat16", "bf16", np.float32])
def test_torch_dtype_takes_strings_numpy_and_torch_dtypes(cpu_torch, tmp_path, dtype):
    torch = cpu_torch
    data = np.arange(6, dtype=np.float32)
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode([("w", "F32", (6,), data.tobytes()),
                             ("n", "I64", (1,), np.int64(3).tobytes())]))
    out = ferry.load_checkpoint(path, dtype=dtype)
    want = torch.float32 if dtype is np.float32 else torch.bfloat16
    assert out["w"].dtype == want and torch.equal(out["w"], torch.from_numpy(data).to(want))
    assert out["n"].dtype == torch.int64


def test_torch_gpu_device_without_a_gpu_is_a_cuda_error_before_any_read(cpu_torch, mixed,
                                                                        monkeypatch):
    # Issue 29: torch's own AssertionError ("Torch not compiled with CUDA enabled") came from
    # inside ferry's first allocation.
    if cpu_torch.cuda.is_available():
        pytest.skip("torch sees a GPU here")
    from ferry.safetensors.torch import load_file
    _no_reads(monkeypatch)
    for device in ("cuda:0", "cuda", 0):
        with pytest.raises(ferry.CudaError, match="sees no GPU"):
            load_file(mixed[0], device=device)


def test_torch_safe_open_slices_rows(cpu_torch, tmp_path):
    torch = cpu_torch
    data = np.arange(60, dtype=np.float32).reshape(6, 10)
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode([("w", "F32", (6, 10), data.tobytes())]))
    with safe_open(str(path), framework="pt", device="cpu") as f:
        w = f.get_tensor("w")
        assert torch.equal(w, torch.from_numpy(data))
        assert torch.equal(f.get_slice("w")[2:4], w[2:4])
        assert torch.equal(f.get_slice("w")[:, 3:5], w[:, 3:5])
        assert f.get_slice("w")[:, 3:5].is_contiguous()
        w.add_(1)  # independent: another tensor is untouched
        assert torch.equal(f.get_tensor("w"), torch.from_numpy(data))


def _vm_flags(address: int) -> str:
    """The VmFlags line of the mapping of this process that holds `address` ("" if none)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line.strip()
    return ""


def test_large_arrays_of_a_numpy_load_start_on_huge_page_boundaries(tmp_path):
    # NumPy advises its large arrays into huge pages but does not align them: a 4 MiB array
    # faulted 513 times, one aligned 2 MiB page and 512 small ones (bench/NOTES.md §55).
    big, small = rng_bytes(4 << 20, 3), rng_bytes(1 << 20, 4)
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode([("big", "U8", (len(big),), big), ("small", "U8", (len(small),),
                                                                   small)]))
    t = ferry.load_checkpoint(path, framework="numpy", host_load="read")
    assert t["big"].tobytes() == big and t["small"].tobytes() == small
    assert t["big"].ctypes.data % (2 << 20) == 0 and t["big"].flags.writeable
    t["big"][:4] = 7  # the caller's array, as np.empty's would be
    assert t["big"][:4].tolist() == [7] * 4


def test_large_host_tensors_of_a_torch_load_ask_for_huge_pages(cpu_torch, tmp_path):
    # torch's allocator neither aligns to 2 MiB nor asks for huge pages: a load's large host
    # tensors get memory that starts on a 2 MiB boundary, advised into huge pages, which its read
    # then writes (bench/NOTES.md §28, §55).
    import mmap
    try:
        probe = mmap.mmap(-1, 4 << 20)
        probe.madvise(mmap.MADV_HUGEPAGE)
        probe.close()
    except (AttributeError, OSError) as e:
        pytest.skip(f"no MADV_HUGEPAGE here: {e}")
    big, small = rng_bytes(6 << 20, 1), rng_bytes(64 << 10, 2)
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode([("big", "U8", (len(big),), big), ("small", "U8", (len(small),),
                                                                   small)]))
    # Read: mapped, the tensors would be the page cache's pages.
    t = ferry.load_checkpoint(path, host_load="read")
    assert t["big"].numpy().tobytes() == big and t["small"].numpy().tobytes() == small
    assert t["big"].data_ptr() % (2 << 20) == 0, hex(t["big"].data_ptr())
    assert " hg" in _vm_flags(t["big"].data_ptr()), _vm_flags(t["big"].data_ptr())
    # The tensors own their memory as torch's own do: it outlives the load's objects, and
    # pickling, sharing and copying take their bytes.
    import pickle
    import torch
    big_t = t.pop("big")
    del t
    assert pickle.loads(pickle.dumps(big_t)).numpy().tobytes() == big
    assert big_t.clone().numpy().tobytes() == big
    shared = big_t.clone()
    shared.share_memory_()
    assert shared.is_shared() and shared.numpy().tobytes() == big
    assert torch.equal(big_t, shared)
