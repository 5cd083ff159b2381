"""ferry behaves as Python code expects (issue 19): buffers let go when a request ends, Futures
that compose, Files like Python files, ferry.load's arguments, introspection, the CLI entry."""

import asyncio
import concurrent.futures
import gc
import inspect
import os
import pathlib
import subprocess
import sys
import warnings
import weakref

import numpy as np
import pytest

import ferry


def test_a_buffer_is_let_go_when_its_request_ends(data_file):
    """Bug 7: a 32 MiB array lived until the File's next request; a bytearray stayed locked."""
    path, _ = data_file
    with ferry.open(path) as f:
        a = np.empty(4 << 20, np.uint8)
        alive = weakref.ref(a)
        fut = f.pread(a, file_offset=1 << 20)
        del a
        assert fut.result() == 4 << 20
        gc.collect()
        assert alive() is None
        b = bytearray(2 << 20)
        assert f.pread(b).result() == 2 << 20
        b.extend(b"more")  # BufferError while ferry still holds an export
        c = np.empty(4 << 20, np.uint8)
        alive = weakref.ref(c)
        dropped = f.pread(c)  # nobody waits: the watcher lets go when it ends
        del c, dropped
        concurrent.futures.wait([f.pread(bytearray(10))])
        for _ in range(100):
            gc.collect()
            if alive() is None:
                break
            import time
            time.sleep(0.01)
        assert alive() is None


def test_futures_compose_with_concurrent_futures_and_asyncio(data_file):
    path, data = data_file
    with ferry.open(path) as f:
        futs = [f.pread(np.empty(1 << 20, np.uint8), file_offset=i << 20) for i in range(4)]
        assert all(isinstance(x, concurrent.futures.Future) for x in futs)
        done, not_done = concurrent.futures.wait(futs, timeout=30)
        assert len(done) == 4 and not not_done
        assert sorted(x.result() for x in concurrent.futures.as_completed(futs)) == [1 << 20] * 4
        assert futs[0].exception() is None
        called = []
        futs[0].add_done_callback(lambda x: called.append(x.result()))
        assert called == [1 << 20]
        assert "finished" in repr(futs[0]) and "1048576" in repr(futs[0])

        async def main():
            return await f.pread(bytearray(1000), file_offset=10)

        assert asyncio.run(main()) == 1000
        assert futs[0].cancel() is False  # already ended


def test_a_future_born_finished_behaves_as_one_finished_on_the_workers(data_file):
    """Issue 48: a small read ends in the submitting thread, and its Future is born finished
    without a Request, a Condition or the watcher; it must answer as a 4 MiB read's does."""
    path, data = data_file
    with ferry.open(path) as f:
        small_buf, big_buf = bytearray(4096), np.empty(4 << 20, np.uint8)
        small, big = f.pread(small_buf, file_offset=8192), f.pread(big_buf, file_offset=1 << 20)
        assert small._request is None  # the fast path was taken (it was a Request before)
        assert big.result(timeout=30) == 4 << 20
        for fut, n, at in ((small, 4096, 8192), (big, 4 << 20, 1 << 20)):
            assert isinstance(fut, concurrent.futures.Future)
            assert fut.done() and not fut.running() and not fut.cancelled()
            assert fut.result() == fut.result(timeout=0) == n and fut.exception() is None
            called = []
            fut.add_done_callback(lambda x: called.append(x.result()))
            assert called == [n]  # at once, in this thread
            assert fut.cancel() is False and fut.result() == n
            assert fut.nbytes == n
            assert fut.last_route.bytes == n and fut.last_route.offset == at
            assert f"finished, {n} bytes" in repr(fut) and "read of" in repr(fut)
        assert bytes(small_buf) == data[8192:8192 + 4096]
        done, not_done = concurrent.futures.wait([small, big], timeout=30)
        assert done == {small, big} and not not_done
        assert sorted(x.result() for x in concurrent.futures.as_completed([small, big])) == [
            4096, 4 << 20]

        async def main():
            return await f.pread(bytearray(1000), file_offset=10)

        assert asyncio.run(main()) == 1000
        # The buffer is let go when the request ends: a bytearray can be resized again.
        small_buf.extend(b"x")


def test_a_future_made_in_c_takes_what_the_python_one_took(data_file, tmp_path):
    """bench/NOTES.md §48: File.pread/pwrite make a small request's finished Future in C, and
    Future.result is a C method; arguments, attributes, waiters and writes as before."""
    path, data = data_file
    with ferry.open(path) as f:
        small = f.pread(bytearray(4096), None, 4096)
        assert type(small) is ferry.Future and small._request is None
        assert small.result(None) == small.result(timeout=5) == 4096
        with pytest.raises(TypeError, match=r"result\(\) takes from 1 to 2 positional"):
            small.result(1, 2)
        with pytest.raises(TypeError, match=r"result\(\) got an unexpected keyword"):
            small.result(wait=1)
        small.note = "a caller's attribute"  # the instance still has a __dict__
        assert small.note == "a caller's attribute"
        # A wait over a finished Future and one never finished puts its waiter on both, then
        # takes it off.
        never = concurrent.futures.Future()
        done, not_done = concurrent.futures.wait([small, never], timeout=0.01)
        assert done == {small} and not_done == {never} and small._waiters == []
        assert inspect.signature(ferry.File.pread) == inspect.signature(ferry.File.read)
        assert str(inspect.signature(ferry.Future.result)) == "(self, /, timeout=None)"
    with ferry.open(tmp_path / "w.bin", "w") as w:
        wrote = w.pwrite(b"y" * 100, file_offset=10)
        assert type(wrote) is ferry.Future and wrote._request is None
        assert wrote.result() == 100 and wrote.nbytes == 100 and "write of 100" in repr(wrote)
    assert (tmp_path / "w.bin").read_bytes() == b"\0" * 10 + b"y" * 100


def test_a_small_failed_read_raises_as_a_large_one_does(data_file, tmp_path):
    """The fast path is for requests that ended well: a failed small read's Future holds the
    error as any Future does, with the same type and message as File.read raises."""
    path = tmp_path / "write-only.bin"
    path.write_bytes(b"x" * 8192)
    with ferry.open(path, "w") as f:
        with pytest.raises(ferry.IoError) as raised:
            f.read(bytearray(4096), file_offset=4096)
        fut = f.pread(bytearray(4096), file_offset=4096)
        assert fut.done()
        e = fut.exception()
        assert type(e) is type(raised.value) and str(e) == str(raised.value)
        assert "write-only.bin" in str(e) and "offset=4096" in str(e)
        with pytest.raises(ferry.IoError, match="offset=4096"):
            fut.result()
        assert fut.cancel() is False


def test_cancel_stops_a_long_request_and_the_error_is_a_future_error(tmp_path):
    path = tmp_path / "sparse.bin"
    with open(path, "wb") as fh:
        fh.truncate(256 << 20)
    buf = np.empty(256 << 20, np.uint8)
    with ferry.open(path, host_nthreads=1, task_size="4KiB", compat="on") as f:
        fut = f.pread(buf)
        assert fut.cancel() is True
        assert fut.cancelled() and fut.done()
        with pytest.raises(concurrent.futures.CancelledError):
            fut.result()


def test_a_failed_future_has_the_exception(data_file):
    with ferry.open(data_file[0], require="cufile") as f:
        fut = f.pread(np.empty(1 << 20, np.uint8))
        assert isinstance(fut.exception(timeout=30), ferry.RouteError)


def test_paths_modes_offsets_and_sizes_are_checked_like_python_files(data_file):
    path, data = data_file
    p = pathlib.Path(path)
    with ferry.File(p) as f:  # os.PathLike everywhere a path is
        assert f.path == path and f.mode == "r"
        assert f"path={path!r}" in repr(f) and "open" in repr(f)
    assert ferry.read_into(p, bytearray(10)) == bytearray(data[:10])
    assert ferry.load(p, np.uint8, device="cpu").nbytes == len(data)
    with pytest.raises(ValueError, match="'r', 'r\\+', 'w', 'w\\+' or 'a', not 'rb'"):
        ferry.open(p, "rb")
    with ferry.open(p) as f:
        for kwargs, cls, words in [({"file_offset": -1}, ValueError, ">= 0, not -1"),
                                   ({"file_offset": 1.5}, TypeError, "an int, not float"),
                                   ({"size": -3}, ValueError, "size must be >= 0"),
                                   ({"size": "10"}, TypeError, "size must be an int, not str")]:
            with pytest.raises(cls, match=words) as info:
                f.read(bytearray(10), **kwargs)
            assert "overload" not in str(info.value)
            with pytest.raises(cls, match=words):
                f.pread(bytearray(10), **kwargs)


def test_an_unclosed_file_warns():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = ferry.open(__file__)
        del f
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "unclosed ferry.File" in str(w.message)
               for w in caught)


def test_load_errors_name_the_problem(data_file, tmp_path):
    """Bug 5: the wrong class for a missing file, shape=1024, device=0, like='jax', an offset
    past the end."""
    path, data = data_file
    with pytest.raises(FileNotFoundError) as info:
        ferry.load(tmp_path / "nope.bin", np.uint8)
    assert isinstance(info.value, ferry.IoError)
    assert ferry.load(path, np.uint8, shape=1024, device="cpu").shape == (1024,)
    from ferry._arrays import _gpu_framework

    if _gpu_framework() is None:
        with pytest.raises(ferry.CudaError, match="device='cpu'"):
            ferry.load(path, np.uint8, device=0)
    with pytest.raises(ValueError, match="past the end"):
        ferry.load(path, np.uint8, file_offset=len(data) + 904, device="cpu")
    with pytest.raises(ValueError, match=">= 0"):
        ferry.load(path, np.uint8, file_offset=-1, device="cpu")
    try:
        import jax  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="JAX is not installed"):
            ferry.load(path, np.uint8, like="jax")
    else:
        if _gpu_framework() is None:
            assert ferry.load(path, np.uint8, like="jax").size == len(data)


def test_load_reads_npy_by_its_header_and_fromfile_reads_raw_bytes(tmp_path):
    a = np.arange(1000, dtype="<f4").reshape(10, 100)
    npy = tmp_path / "a.npy"
    np.save(npy, a)
    got = ferry.load(npy, device="cpu")
    assert got.dtype == a.dtype and got.shape == a.shape and (got == a).all()
    with pytest.raises(ValueError, match="float64"):
        ferry.load(npy, np.float64, device="cpu")
    raw = ferry.fromfile(npy, np.uint8, device="cpu")
    assert raw.nbytes == npy.stat().st_size  # the header too: raw bytes
    with pytest.raises(TypeError, match="dtype"):
        ferry.load(_raw_file(tmp_path))


def _raw_file(tmp_path):
    path = tmp_path / "raw.bin"
    path.write_bytes(b"\0" * 16)
    return path


def test_every_public_name_has_docs():
    for name in ferry.__all__:
        obj = getattr(ferry, name, None)
        if obj is None:
            continue  # cuFile's names, when built without it
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not callable(member) or isinstance(member, property):
                    continue  # fields are described in the class's docs
                assert inspect.getdoc(member), f"{name}.{attr}"


def test_python_m_ferry_version_and_a_missing_cli():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "ferry", "--version"], capture_output=True,
                          text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith(f"ferry {ferry.__version__}")
    done = subprocess.run([sys.executable, "-m", "ferry", "read"], capture_output=True, text=True,
                          env={**env, "FERRY_CLI": "/nonexistent/ferry"}, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "/nonexistent/ferry" in done.stderr and "FERRY_CLI" in done.stderr


def test_import_ferry_loads_no_asyncio_until_a_future_is_awaited(data_file):
    # asyncio costs about 10 ms of a process's `import ferry` (17 ms in all), which a checkpoint
    # load in a fresh process pays: only code that awaits a Future needs it.
    code = f"""
import sys
import numpy as np
import ferry
assert "asyncio" not in sys.modules, "import ferry imported asyncio"
f = ferry.File({data_file[0]!r})
buf = np.empty(4096, np.uint8)
async def main():
    return await f.pread(buf, 4096, 0)
import asyncio
assert asyncio.run(main()) == 4096
assert bytes(buf) == {data_file[1][:4096]!r}
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr
