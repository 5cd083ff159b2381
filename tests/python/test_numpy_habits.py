"""ferry.fromfile and ferry.load take what a NumPy or PyTorch user writes: NumPy's keyword names,
missing files as FileNotFoundError, misspelt keywords as TypeError naming the nearest one,
NumPy, PyTorch and string dtypes, and the device the machine has."""

import os
import subprocess
import sys

import numpy as np
import pytest

import ferry


@pytest.fixture
def raw(tmp_path):
    p = tmp_path / "raw.bin"
    values = np.arange(64, dtype=np.float32)
    p.write_bytes(b"\0" * 4 + values.tobytes())
    return p, values


def test_fromfile_takes_numpys_offset_and_count(raw):
    p, values = raw
    a = ferry.fromfile(p, np.float32, offset=4, count=10, like="numpy")
    assert a.shape == (10,) and np.array_equal(a, values[:10])
    b = ferry.fromfile(p, np.float32, offset=4, like="numpy")
    assert np.array_equal(b, values)
    assert np.array_equal(ferry.fromfile(p, np.float32, offset=4, count=-1, like="numpy"), values)


def test_numpys_sep_and_mmap_mode_are_refused_saying_why(raw):
    p, _ = raw
    with pytest.raises(ValueError, match="binary files only"):
        ferry.fromfile(p, np.float32, sep=",")
    with pytest.raises(ValueError, match="mmap_mode"):
        ferry.load(p, dtype=np.uint8, mmap_mode="r")
    # NumPy's defaults mean what ferry does: accepted.
    assert ferry.fromfile(p, np.uint8, sep="", like="numpy").size == 4 + 64 * 4


def test_offset_and_file_offset_together_or_count_and_shape_together_are_refused(raw):
    p, _ = raw
    with pytest.raises(TypeError, match="give one"):
        ferry.fromfile(p, np.float32, offset=4, file_offset=4)
    with pytest.raises(TypeError, match="give one"):
        ferry.fromfile(p, np.float32, count=4, shape=(4,))


def test_an_unknown_keyword_is_a_type_error_naming_the_nearest(raw):
    p, _ = raw
    with pytest.raises(TypeError, match="unexpected keyword argument 'file_ofset'; did you mean "
                                        "file_offset"):
        ferry.fromfile(p, np.float32, file_ofset=4)
    with pytest.raises(TypeError, match="did you mean task_size"):
        ferry.load(p, dtype=np.uint8, task_sise="1MiB")
    with pytest.raises(TypeError, match="did you mean file_offset"):
        ferry.read_into(p, np.empty(4, np.uint8), file_offest=0)
    # Settings are still keywords.
    assert ferry.fromfile(p, np.uint8, task_size="4KiB", like="numpy").size == 260


@pytest.mark.parametrize("name", ["nope.bin", "nope.npy", "nope.npz"])
def test_a_missing_file_is_file_not_found(tmp_path, name):
    with pytest.raises(FileNotFoundError) as e:
        ferry.load(tmp_path / name, dtype=np.uint8)
    assert e.value.filename == os.fspath(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        ferry.load(tmp_path / name)
    with pytest.raises(FileNotFoundError):
        ferry.fromfile(tmp_path / name, np.uint8)


def test_an_npz_archive_is_named_as_such(tmp_path):
    p = tmp_path / "a.npz"
    np.savez(p, a=np.arange(3))
    with pytest.raises(ValueError, match="npz archive"):
        ferry.load(p)


def test_string_dtypes_are_numpys(raw):
    p, values = raw
    assert np.array_equal(ferry.fromfile(p, "float32", offset=4, like="numpy"), values)
    assert np.array_equal(ferry.fromfile(p, "<f4", offset=4, like="numpy"), values)


def test_torch_dtypes_and_bfloat16_with_like_torch(raw):
    torch = pytest.importorskip("torch")
    p, values = raw
    t = ferry.fromfile(p, torch.float32, offset=4, like="torch", device="cpu")
    assert t.dtype == torch.float32 and torch.equal(t, torch.from_numpy(values))
    b = ferry.fromfile(p, torch.bfloat16, offset=4, like="torch", device="cpu")
    assert b.dtype == torch.bfloat16 and b.shape == (128,)
    expect = torch.from_numpy(values.view(np.uint8).copy()).view(torch.bfloat16)
    assert torch.equal(b, expect)
    # The name too, and without like: bfloat16 exists in PyTorch only.
    assert ferry.fromfile(p, "bfloat16", offset=4, device="cpu").dtype == torch.bfloat16
    with pytest.raises(TypeError, match="PyTorch only"):
        ferry.fromfile(p, torch.bfloat16, like="numpy")


def test_bfloat16_stays_pytorchs_where_numpy_knows_one_through_ml_dtypes(raw,
                                                                         numpy_with_bfloat16):
    """Seen on the GPU machine (ml_dtypes installed): "bfloat16" became NumPy's registered
    dtype, and the read into that array was refused as 'read-only'."""
    torch = pytest.importorskip("torch")
    p, values = raw
    b = ferry.fromfile(p, "bfloat16", offset=4, device="cpu")
    assert b.dtype == torch.bfloat16 and b.shape == (128,)
    assert torch.equal(b, torch.from_numpy(values.view(np.uint8).copy()).view(torch.bfloat16))
    # NumPy's own names are still NumPy's.
    assert np.array_equal(ferry.fromfile(p, "float32", offset=4, like="numpy"), values)


def test_a_numpy_array_of_a_registered_dtype_is_filled(raw, registered_dtype):
    """NumPy gives such an array's buffer only without a format: read as its bytes, not refused
    as a read-only target (nor is datetime64, which has no buffer format either)."""
    dtype = registered_dtype
    p, values = raw
    want = values.view(np.uint8)
    a = np.zeros(256 // dtype.itemsize, dtype)
    assert ferry.read_into(p, a, file_offset=4) is a
    assert a.tobytes() == want.tobytes()
    b = ferry.fromfile(p, dtype, offset=4, like="numpy", device="cpu")
    assert b.dtype == dtype and b.tobytes() == want.tobytes()
    c = ferry.read_into(p, np.zeros((4, 8), "datetime64[s]"), file_offset=4)
    assert c.tobytes() == want.tobytes()
    with pytest.raises(ValueError, match="read-only"):
        ferry.read_into(p, np.frombuffer(bytes(16), dtype))
    with pytest.raises(ValueError, match="not C-contiguous"):
        ferry.read_into(p, np.zeros(16, dtype)[::2])


def test_like_torch_picks_the_device_the_machine_has(raw):
    torch = pytest.importorskip("torch")
    p, values = raw
    t = ferry.fromfile(p, np.float32, offset=4, like="torch")
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert t.device.type == want
    assert torch.equal(t.cpu(), torch.from_numpy(values))


def test_open_with_a_setting_replaces_a_malformed_variable_of_it(raw):
    """As `ferry read --task-size` does under FERRY_TASK_SIZE=abc."""
    p, _ = raw
    code = ("import ferry, numpy as np, sys\n"
            "with ferry.open(sys.argv[1], task_size='4KiB') as f:\n"
            "    a = np.empty(260, np.uint8); f.read(a)\n"
            "    print(f.settings['task_size'])\n"
            "try:\n"
            "    ferry.open(sys.argv[1]).read(np.empty(4, np.uint8))\n"
            "except ferry.SettingError as e:\n"
            "    print('still refused:', 'FERRY_TASK_SIZE' in str(e))\n")
    done = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True,
                          env={**os.environ, "FERRY_TASK_SIZE": "abc"}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["4096", "still refused: True"], done.stdout


def test_threads_means_ferrys_workers_for_both_memories_as_the_cli_flag(raw):
    p, _ = raw
    with ferry.open(p, threads=3) as f:
        assert f.settings["nthreads"] == 3 and f.settings["host_nthreads"] == 3


def test_one_device_parser_reads_each_form_and_names_each_refusal(raw):
    """ferry.load, ferry.fromfile and the checkpoint loads read a device through one parser
    (issue 46): each accepted form, and each refusal naming the function that was called."""
    from ferry._arrays import parse_device
    from ferry.checkpoint import _gpu_ordinal
    for given, ordinal in (("cpu", None), ("cuda", 0), ("cuda:0", 0), ("cuda:3", 3), (0, 0),
                           (2, 2)):
        assert parse_device(given, "f") == ordinal, given
        assert _gpu_ordinal(given) == ordinal, given
    assert _gpu_ordinal(None) is None
    refusals = [(-1, ValueError, "f: device must be >= 0, not -1"),
                (True, TypeError, "f: device must be 'cpu', 'cuda', 'cuda:N' or an int, not bool"),
                (1.0, TypeError, "f: device must be 'cpu', 'cuda', 'cuda:N' or an int, not float"),
                (None, TypeError, "or an int, not NoneType"),
                ("gpu", ValueError, "f: device must be 'cpu', 'cuda', 'cuda:N' or an int, not "
                                    "'gpu'"),
                ("cuda:", ValueError, "not 'cuda:'"),
                ("cuda:-1", ValueError, "not 'cuda:-1'"),
                ("CUDA:0", ValueError, "not 'CUDA:0'")]
    for given, kind, words in refusals:
        with pytest.raises(kind) as e:
            parse_device(given, "f")
        assert words in str(e.value), given
    with pytest.raises(ValueError, match="^ferry: device must be .* not 'xpu'$"):
        _gpu_ordinal("xpu")  # load_checkpoint's, str() of a torch.device included
    p, _ = raw
    with pytest.raises(ValueError, match="^ferry.fromfile: device must be .* not 'gpu'$"):
        ferry.fromfile(p, np.float32, device="gpu")
    with pytest.raises(TypeError, match="^ferry.load: device must be .* not bool$"):
        ferry.load(p, np.float32, shape=(2,), device=True)
