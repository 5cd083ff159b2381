"""The engine seen from Python: requests in processes made by fork() (multiprocessing's fork
start method, as PyTorch DataLoader workers use it), and small reads answered at once."""

import hashlib
import multiprocessing
import threading

import numpy as np
import pytest

import ferry


def _digest_of_read(args):
    path, offset, size = args
    buf = bytearray(size)
    with ferry.open(path) as f:
        n = f.read(buf, file_offset=offset)  # several tasks: the child's own workers
        small = bytearray(4096)
        f.read(small, file_offset=offset)  # one task: in this thread
    return n, hashlib.sha256(bytes(buf[:n])).hexdigest(), bytes(small) == bytes(buf[:4096])


def test_fork_children_read_after_the_parent_used_the_workers(data_file):
    path, data = data_file
    with ferry.open(path) as f:
        a = np.empty(len(data), np.uint8)
        assert f.read(a) == len(data)  # the parent's workers exist now
        # And a request is in flight in another thread while the children are forked.
        busy = np.empty(len(data), np.uint8)
        fut = f.pread(busy)
        ctx = multiprocessing.get_context("fork")
        jobs = [(path, off, 3 << 20) for off in (0, 1 << 20, 5 << 20)]
        with ctx.Pool(3) as pool:
            results = pool.map_async(_digest_of_read, jobs).get(timeout=60)
        assert fut.result() == len(data)
    for (_, off, size), (n, digest, small_ok) in zip(jobs, results):
        expected = data[off:off + size]
        assert n == len(expected)
        assert digest == hashlib.sha256(expected).hexdigest()
        assert small_ok


def test_a_small_asynchronous_read_is_done_when_it_returns(data_file):
    path, data = data_file
    with ferry.open(path) as f:
        buf = bytearray(4096)
        fut = f.pread(buf, None, 12288)
        assert fut.done()
        assert fut.result() == 4096
        assert bytes(buf) == data[12288:12288 + 4096]
        route = fut.last_route
        assert route.tasks == 1 and route.workers == 1
        assert "under 1 MiB" in route.page_cache.why_not


def test_small_reads_from_many_threads_on_one_file(data_file):
    path, data = data_file
    errors = []
    with ferry.open(path) as f:
        def worker(seed):
            rng = np.random.default_rng(seed)
            buf = bytearray(4096)
            for off in rng.integers(0, (len(data) - 4096) // 4096, 300) * 4096:
                if f.read(buf, None, int(off)) != 4096 or bytes(buf) != data[off:off + 4096]:
                    errors.append(int(off))
        threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_mode_a_appends_whatever_the_offset_and_threads_lose_nothing(tmp_path):
    path = tmp_path / "log.bin"
    path.write_bytes(b"abc")
    with ferry.open(str(path), "a") as f:
        assert f.write(b"XX", None, 0) == 2  # used to overwrite the start
    assert path.read_bytes() == b"abcXX"
    block = 4096
    with ferry.open(str(path), "a") as f:
        def worker(t):
            for i in range(200):
                f.append(bytes([t * 8 + i % 8]) * block)
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    data = path.read_bytes()[5:]
    assert len(data) == 2 * 200 * block
    for off in range(0, len(data), block):
        assert data[off:off + block] == data[off:off + 1] * block, f"torn block at {off}"


def test_arrays_of_python_objects_are_refused_before_any_io(tmp_path, data_file):
    """Issue 19, bug 1: reading into an object array returned 32 and crashed the interpreter
    at the next print; writing one stored raw pointers."""
    path, data = data_file
    with ferry.open(path) as f:
        a = np.empty(4, dtype=object)
        with pytest.raises(TypeError, match="Python objects"):
            f.read(a)
        assert list(a) == [None, None, None, None]  # untouched, printable
        print(a)
        rec = np.empty(2, dtype=[("x", "<i4"), ("Obj", object)])
        with pytest.raises(TypeError, match="Python objects"):
            f.read(rec)
        plain = np.empty(2, dtype=[("Other", "<i4"), ("y", "<f8")])  # an 'O' in a name only
        assert f.read(plain) == plain.nbytes
    out = tmp_path / "o.bin"
    with ferry.open(str(out), "w") as w:
        with pytest.raises(TypeError, match="Python objects"):
            w.write(np.array([object(), object()], dtype=object))
    assert out.stat().st_size == 0


_ONE_TASK_CHILD = r"""
import os, sys
import numpy as np
import ferry

def threads():
    return len(os.listdir("/proc/self/task"))

path = sys.argv[1]
with ferry.open(path, task_size="4MiB") as f:
    f.read(np.empty(4096, np.uint8))  # whatever ferry starts on first use (stats, settings)
    before = threads()
    one_task = np.empty(1 << 20, np.uint8)
    for i in range(8):
        assert f.read(one_task, file_offset=i << 20) == 1 << 20
    after_one_task = threads()
    f.read(np.empty(8 << 20, np.uint8))  # two tasks: these go to the workers
    print(before, after_one_task, threads())
"""


def test_a_synchronous_read_of_one_task_runs_in_the_callers_thread(tmp_path):
    # A 1 MiB File.read went to a worker and back (about 20 us of a 100 us read, 1.37x
    # os.preadv); now a request of one task runs in this thread, as C++ File::read does, so no
    # worker is started for it. The two-task read shows the count can move.
    import subprocess
    import sys

    path = tmp_path / "f.bin"
    path.write_bytes(np.random.default_rng(7).integers(0, 256, 16 << 20, np.uint8).tobytes())
    out = subprocess.run([sys.executable, "-c", _ONE_TASK_CHILD, str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after_one_task, after_two_tasks = map(int, out.stdout.split())
    assert after_one_task == before, "a one-task File.read started worker threads"
    assert after_two_tasks > before
