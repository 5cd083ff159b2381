"""C++ errors surface as Python exceptions of the expected builtin classes, with context."""

import errno
import os

import numpy as np
import pytest

import ferry


def test_missing_file_is_file_not_found_and_ferry_io_error(tmp_path):
    missing = str(tmp_path / "nope.bin")
    with pytest.raises(FileNotFoundError) as info:
        ferry.open(missing)
    e = info.value
    assert isinstance(e, ferry.IoError) and isinstance(e, OSError) and isinstance(e, ferry.Error)
    assert e.errno == errno.ENOENT
    assert e.filename == missing
    assert e.op == "open"
    assert missing in str(e) and str(e).startswith("[Errno 2]")


def test_permission_error_maps_to_its_builtin(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores file permissions")
    path = tmp_path / "locked.bin"
    path.write_bytes(b"x")
    path.chmod(0)
    with pytest.raises(PermissionError):
        ferry.open(path)


def test_writing_a_read_only_file_names_the_operation(data_file):
    path, _ = data_file
    with ferry.open(path) as f:
        with pytest.raises(ferry.IoError) as info:
            f.write(b"abc", file_offset=5)
    assert info.value.errno == errno.EBADF
    assert info.value.offset == 5 and info.value.length == 3
    assert info.value.filename == path


def test_strict_mode_raises_route_error_with_the_report(data_file):
    path, _ = data_file
    with ferry.open(path, require="cufile") as f:
        with pytest.raises(ferry.RouteError) as info:
            f.read(np.empty(1 << 20, np.uint8))  # host memory never goes to cuFile
        fut = f.pread(np.empty(1 << 20, np.uint8))
        with pytest.raises(ferry.RouteError):
            fut.result()
    e = info.value
    assert isinstance(e, OSError)
    assert "require=cufile" in str(e)
    assert e.report is not None and e.report.file == path and e.report.bytes == 0
    assert e.report.reasons


def test_error_classes_mix_with_builtins():
    assert issubclass(ferry.RouteError, OSError)
    assert issubclass(ferry.CudaError, RuntimeError)
    assert issubclass(ferry.SettingError, ValueError)
    for cls in (ferry.IoError, ferry.RouteError, ferry.CudaError, ferry.SettingError):
        assert issubclass(cls, ferry.Error) and cls.__module__ == "ferry"


def test_asking_for_a_gpu_without_one_is_a_cuda_error(data_file):
    from ferry._arrays import _gpu_framework

    if _gpu_framework() is not None:
        pytest.skip("a GPU framework sees a GPU here")
    with pytest.raises(ferry.CudaError, match="device='cpu'"):
        ferry.load(data_file[0], np.uint8, device="cuda:0")


def _open_missing(path):
    ferry.open(path)


def test_every_error_pickles_to_an_equal_object(tmp_path, data_file):
    """Issue 19, bug 3: the per-errno classes are made at run time and did not pickle."""
    import pickle

    errors = []
    for bad in (lambda: ferry.open(tmp_path / "nope.bin"),
                lambda: ferry.settings.update(task_size="bogus"),
                lambda: ferry.open(data_file[0], require="cufile").read(np.empty(10, np.uint8))):
        with pytest.raises(ferry.Error) as info:
            bad()
        errors.append(info.value)
    errors += [ferry.CudaError("no driver"), ferry.Error("plain"), ferry.IoError(5, "eio")]
    for e in errors:
        copy = pickle.loads(pickle.dumps(e))
        assert type(copy) is type(e) and copy == e and str(copy) == str(e)
    assert isinstance(pickle.loads(pickle.dumps(errors[0])), FileNotFoundError)
    assert pickle.loads(pickle.dumps(errors[2])).report == errors[2].report


def test_errors_cross_a_process_pool(tmp_path):
    from concurrent.futures import ProcessPoolExecutor

    missing = tmp_path / "nope.bin"
    with ProcessPoolExecutor(1) as pool:
        with pytest.raises(FileNotFoundError) as info:
            pool.submit(_open_missing, str(missing)).result(timeout=60)
    assert isinstance(info.value, ferry.IoError) and info.value.filename == str(missing)


@pytest.mark.parametrize("helper", [
    lambda p: ferry.fromfile(p, "float32"),
    lambda p: ferry.fromfile(p, "float32", device="cpu"),
    lambda p: ferry.load(p),
    lambda p: ferry.read_into(p, np.empty(4, np.uint8)),
    lambda p: ferry.open(p),
], ids=["fromfile", "fromfile-cpu", "load", "read_into", "open"])
def test_a_missing_file_is_named_in_the_message_by_every_helper(tmp_path, helper):
    # Issue 47: ferry.fromfile said "[Errno 2] ferry.fromfile: no such file", naming no file.
    missing = str(tmp_path / "nope.bin")
    with pytest.raises(FileNotFoundError) as info:
        helper(missing)
    assert missing in str(info.value), str(info.value)
    assert isinstance(info.value, ferry.IoError) and info.value.filename == missing
