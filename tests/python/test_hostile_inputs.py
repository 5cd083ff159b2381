"""Issue 30, part B: what a hostile caller or file hands ferry's Python API and CLI (paths with
NUL or non-UTF-8 bytes, offsets past 64 bits, forged ``__cuda_array_interface__``, headers with
bad bytes, indexes that point out of their folder, sysfs files, ``ferry bench`` stopped or given
absurd sizes). Each test pins one finding of the issue; docs/reliability.md maps them."""

from __future__ import annotations

import gc
import json
import os
import signal
import struct
import subprocess
import time

import numpy as np
import pytest

import ferry
from ferry.checkpoint import CheckpointError
from test_checkpoint import encode


def cli():
    path = os.environ.get("FERRY_CLI")
    if not path or not os.path.exists(path):
        pytest.skip("FERRY_CLI does not name the built ferry tool")
    return path


# --------------------------------------------------------------------------- finding 5


def test_each_load_path_parses_each_header_once(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode([("a", "U8", [2], b"ab"), ("b", "U8", [1], b"c")]))
    real, opened = ferry.checkpoint._ferry.Checkpoint, []

    def counting(*args, **kwargs):
        opened.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(ferry.checkpoint._ferry, "Checkpoint", counting)
    from ferry.safetensors import safe_open
    from ferry.safetensors.numpy import load_file
    assert set(load_file(str(path))) == {"a", "b"}
    assert len(opened) == 1
    assert set(ferry.load_checkpoint(str(path), framework="numpy")) == {"a", "b"}
    assert len(opened) == 2
    with safe_open(str(path), framework="numpy") as f:
        assert f.get_tensor("a").tobytes() == b"ab" and f.get_slice("b")[0:1].tobytes() == b"c"
    assert len(opened) == 3


# --------------------------------------------------------------------------- finding 6: NUL


def test_a_nul_byte_in_a_path_is_refused_everywhere_a_path_enters(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_bytes(b"precious")
    cut = str(keep) + "\0.bin"
    with pytest.raises(ValueError, match="embedded null byte"):
        ferry.open(cut, "w")
    with pytest.raises(ValueError, match="embedded null byte"):
        ferry.open(os.fsencode(cut), "w")
    with pytest.raises(ValueError, match="embedded null byte"):
        ferry.load_checkpoint(cut)
    with pytest.raises(ValueError, match="embedded null byte"):
        ferry.fromfile(cut, dtype="uint8")
    with pytest.raises(ValueError, match="embedded null byte"):
        ferry.read_into(cut, np.empty(4, np.uint8))
    import ferry.kvikio as kvikio
    with pytest.raises(ValueError, match="embedded null byte"):
        kvikio.CuFile(cut, "w")
    assert keep.read_bytes() == b"precious"


def test_a_nul_byte_in_a_weight_map_entry_is_refused(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(encode([("w", "U8", [1], b"a")]))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "a.safetensors\u0000.bak"}}))
    with pytest.raises(CheckpointError, match="NUL"):
        ferry.load_checkpoint(str(tmp_path), framework="numpy")


# --------------------------------------------------------------------------- finding 12


def test_a_header_byte_that_is_not_utf8_is_a_checkpoint_error_naming_the_file(tmp_path):
    path = tmp_path / "bad.safetensors"
    header = b'{"\xff":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"x")
    with pytest.raises(CheckpointError) as info:
        ferry.load_checkpoint(str(path), framework="numpy")
    assert str(path) in str(info.value) and "not valid JSON" in str(info.value)
    assert info.value.filename == str(path)


def test_paths_that_are_not_utf8_open_as_str_bytes_and_pathlike(tmp_path):
    raw = os.fsencode(str(tmp_path)) + b"/caf\xe9.bin"
    with open(raw, "wb") as f:
        f.write(b"0123456789")
    as_str = os.fsdecode(raw)  # a lone surrogate stands for the byte
    for path in (as_str, raw, type("P", (), {"__fspath__": lambda self: raw})()):
        with ferry.open(path) as f:
            buf = np.empty(10, np.uint8)
            assert f.read(buf) == 10 and buf.tobytes() == b"0123456789"
            assert f.path == as_str
            repr(f)
    with pytest.warns(ResourceWarning, match="caf"):
        f = ferry.open(raw)
        del f  # __del__ formats the path too: no UnicodeDecodeError, only the ResourceWarning
        gc.collect()
    with pytest.raises(FileNotFoundError) as info:
        ferry.open(raw + b".missing")
    assert info.value.filename == os.fsdecode(raw + b".missing")


def test_an_offset_past_64_bits_is_an_overflow_error_naming_the_argument(tmp_path):
    path = tmp_path / "d.bin"
    path.write_bytes(b"x" * 16)
    with ferry.open(str(path)) as f:
        with pytest.raises(OverflowError, match="file_offset"):
            f.read(np.empty(4, np.uint8), file_offset=2**64)
        with pytest.raises(OverflowError, match="file_offset"):
            f.pread(np.empty(4, np.uint8), file_offset=2**70).result()


class _Fake:
    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


@pytest.mark.parametrize("cai, says", [
    ({"shape": (4,), "typestr": "|u1", "version": 3}, "has no 'data'"),
    ({"shape": (4,), "typestr": "|ux", "data": (0, False), "version": 3}, "typestr"),
    ({"shape": (4,), "typestr": "u", "data": (0, False), "version": 3}, "typestr"),
    ({"shape": "4", "typestr": "|u1", "data": (0, False), "version": 3}, "shape"),
    ({"shape": (4,), "typestr": "|u1", "data": "0x10", "version": 3}, "data"),
    ({"shape": (2**62, 8), "typestr": "<f8", "data": (4096, False), "version": 3}, "64 bits"),
    ({"shape": (-1,), "typestr": "|u1", "data": (4096, False), "version": 3}, "negative"),
])
def test_a_forged_cuda_array_interface_is_a_clear_error(tmp_path, cai, says):
    path = tmp_path / "d.bin"
    path.write_bytes(b"x" * 16)
    with ferry.open(str(path)) as f:
        with pytest.raises((TypeError, ValueError), match="__cuda_array_interface__") as info:
            f.read(_Fake(cai))
        assert says in str(info.value)
    with ferry.open(str(path)) as f:
        with pytest.raises(TypeError, match="not a dict"):
            f.read(_Fake([1, 2]))


# --------------------------------------------------------------------------- finding 11


def test_json_output_of_a_path_that_is_not_utf8_is_valid_json(tmp_path):
    ferry_cli = cli()
    raw = os.fsencode(str(tmp_path)) + b"/caf\xe9.bin"
    st = os.fsencode(str(tmp_path)) + b"/m\xe9.safetensors"
    with open(st, "wb") as f:
        f.write(encode([("w", "U8", [4], b"abcd")]))
    for args in ([b"write", raw, b"--host", b"--size", b"4KiB", b"--pattern", b"zero", b"--json"],
                 [b"read", raw, b"--host", b"--json"],
                 [b"load", st, b"--host", b"--json"]):
        done = subprocess.run([os.fsencode(ferry_cli)] + args, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert "\ufffd" in json.dumps(out, ensure_ascii=False)


# --------------------------------------------------------------------------- finding 10


def test_bench_refuses_absurd_sizes_before_making_its_file(tmp_path):
    ferry_cli = cli()
    for args, says in ((["--total", "0"], "--total"), (["-i", "1TiB"], "fewer than"),
                       (["-i", "1"], "below 512 B"), (["-T", "nan"], "nan")):
        done = subprocess.run([ferry_cli, "bench", "-s", "1MiB", "-D", str(tmp_path)] + args,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, args
        assert says in done.stdout + done.stderr, (args, done.stdout, done.stderr)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_bench_stopped_by_a_signal_removes_its_temporary_file(tmp_path, sig):
    ferry_cli = cli()
    proc = subprocess.Popen([ferry_cli, "bench", "-s", "8MiB", "-D", str(tmp_path), "-T", "60",
                             "--memory", "host"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not os.listdir(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert os.listdir(tmp_path), "the bench never made its file"
        time.sleep(0.5)  # into the measurement (or still writing the file: removed as well)
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -sig
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- finding 15


def test_a_sysfs_file_reads_to_its_short_end():
    path = "/sys/kernel/mm/transparent_hugepage/enabled"
    if not os.path.exists(path):
        pytest.skip(f"{path} is not here")
    with open(path, "rb") as f:
        expected = f.read()
    with ferry.open(path) as f:
        buf = np.zeros(f.size, np.uint8)
        n = f.read(buf)
    assert buf[:n].tobytes() == expected
    ferry_cli = cli()
    done = subprocess.run([ferry_cli, "read", path, "--host"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
