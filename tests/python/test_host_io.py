"""Reads and writes through host buffers (NumPy, bytearray, memoryview) against a reference."""

import gc
import random

import numpy as np
import pytest

import ferry


def test_numpy_random_offsets_and_sizes_match_reference(data_file):
    path, data = data_file
    rng = random.Random(5)
    with ferry.open(path) as f:
        assert f.size == len(data)
        for _ in range(40):
            offset = rng.randrange(len(data))
            size = rng.randrange(1, min(len(data) - offset, 6 << 20) + 1)
            dtype = rng.choice([np.uint8, np.int16, np.float32, np.float64])
            count = size // np.dtype(dtype).itemsize or 1
            a = np.empty(count, dtype)
            n = f.read(a, file_offset=offset)
            assert n == min(a.nbytes, len(data) - offset)
            assert a.view(np.uint8)[:n].tobytes() == data[offset:offset + n]


def test_bytearray_and_memoryview_random_offsets_match_reference(data_file):
    path, data = data_file
    rng = random.Random(7)
    with ferry.open(path) as f:
        for i in range(30):
            offset = rng.randrange(len(data))
            size = rng.randrange(1, 1 << 20)
            target = bytearray(size)
            view = memoryview(target) if i % 2 else target
            n = f.read(view, file_offset=offset)
            assert n == min(size, len(data) - offset)
            assert bytes(target[:n]) == data[offset:offset + n]


def test_contiguous_slices_and_2d_arrays_are_accepted(data_file):
    path, data = data_file
    a = np.zeros((64, 1024), np.uint8)
    with ferry.open(path) as f:
        assert f.read(a[10:20], file_offset=3) == 10 * 1024
        assert f.read(memoryview(bytearray(100))[10:60]) == 50
    assert a[10:20].tobytes() == data[3:3 + 10 * 1024]
    assert not a[:10].any() and not a[20:].any()


def test_size_argument_limits_the_read(data_file):
    path, data = data_file
    a = np.zeros(1000, np.uint8)
    with ferry.open(path) as f:
        assert f.read(a, 100, file_offset=50) == 100
        with pytest.raises(ValueError, match="larger than the buffer"):
            f.read(a, 1001)
    assert a[:100].tobytes() == data[50:150] and not a[100:].any()


def test_read_past_end_returns_fewer_bytes(data_file):
    path, data = data_file
    buf = bytearray(1000)
    with ferry.open(path) as f:
        assert f.read(buf, file_offset=len(data) - 10) == 10
        assert f.read(buf, file_offset=len(data) + 10) == 0


def test_non_contiguous_target_is_a_clear_error(data_file):
    path, _ = data_file
    a = np.zeros((100, 100), np.uint8)
    with ferry.open(path) as f:
        for bad in (a[:, ::2], a.T, a[::3]):
            with pytest.raises(ValueError, match="not C-contiguous"):
                f.read(bad)
    assert not a.any()


def test_read_into_read_only_or_foreign_objects_is_refused(data_file):
    path, _ = data_file
    frozen = np.zeros(10, np.uint8)
    frozen.flags.writeable = False
    with ferry.open(path) as f:
        with pytest.raises(ValueError, match="read-only"):
            f.read(b"0123456789")
        with pytest.raises(ValueError, match="read-only"):
            f.read(frozen)
        with pytest.raises(TypeError, match="exports no memory"):
            f.read([0] * 10)


def test_bytearray_is_released_after_a_read(data_file):
    path, _ = data_file
    buf = bytearray(100)
    with ferry.open(path) as f:
        f.read(buf)
        buf.extend(b"more")  # BufferError if ferry still held an export
    assert len(buf) == 104


def test_write_then_read_back(tmp_path):
    path = tmp_path / "out.bin"
    rng = np.random.default_rng(3)
    src = rng.integers(0, 255, 3 << 20, dtype=np.uint8)
    with ferry.open(path, "w+") as f:
        assert f.write(src) == src.nbytes
        assert f.write(b"tail", file_offset=src.nbytes) == 4
        assert f.pwrite(memoryview(b"xy"), file_offset=1).result() == 2
        f.sync()
        assert f.last_route.op == "write"
    expected = bytearray(src.tobytes() + b"tail")
    expected[1:3] = b"xy"
    assert path.read_bytes() == bytes(expected)


def test_append_mode_writes_at_the_end(tmp_path):
    path = tmp_path / "log.bin"
    path.write_bytes(b"abc")
    with ferry.open(path, "a") as f:
        assert f.append(b"def") == 3
        assert f.append(bytearray(b"ghi")) == 3
    assert path.read_bytes() == b"abcdefghi"


def test_async_futures_complete_and_match(data_file):
    path, data = data_file
    chunk = 1 << 20
    with ferry.open(path) as f:
        targets = [np.empty(chunk, np.uint8) for _ in range(8)]
        futures = [f.pread(t, file_offset=i * chunk) for i, t in enumerate(targets)]
        assert [fut.result(timeout=30) for fut in futures] == [chunk] * 8
        assert all(fut.done() for fut in futures)
        assert futures[0].last_route.bytes == chunk
    for i, t in enumerate(targets):
        assert t.tobytes() == data[i * chunk:(i + 1) * chunk]


def test_future_keeps_an_unreferenced_buffer_alive(data_file):
    path, _ = data_file
    with ferry.open(path) as f:
        futures = [f.pread(bytearray(1 << 20), file_offset=i << 20) for i in range(6)]
        gc.collect()
        assert sum(fut.result() for fut in futures) == 6 << 20
        f.pread(np.empty(1 << 20, np.uint8))  # dropped at once: close() waits for it


def test_a_closed_file_answers_path_and_route_and_refuses_io_with_value_error(data_file):
    path, _ = data_file
    f = ferry.open(path)
    f.read(bytearray(10))
    f.close()
    f.close()  # twice is harmless, as for Python files
    assert f.closed and f.path == path and f.last_route.bytes == 10
    for io in (lambda: f.read(bytearray(10)), lambda: f.pread(bytearray(10)),
               lambda: f.write(b"x"), lambda: f.append(b"x"), lambda: f.sync(), lambda: f.size):
        with pytest.raises(ValueError, match="closed file"):
            io()
    assert "closed" in repr(f)


def test_read_into_and_load_on_the_host(data_file):
    path, data = data_file
    a = np.empty(1000, np.uint8)
    assert ferry.read_into(path, a, file_offset=7) is a
    assert a.tobytes() == data[7:1007]
    assert ferry.last_route().bytes == 1000

    whole = ferry.load(path, np.uint8, device="cpu")
    assert isinstance(whole, np.ndarray) and whole.tobytes() == data
    grid = ferry.load(path, "<i4", shape=(16, 256), device="cpu")
    assert grid.shape == (16, 256) and grid.tobytes() == data[:16 * 256 * 4]
    assert ferry.load(path, np.uint8, like=np).tobytes() == data


def test_load_refuses_what_it_cannot_do(data_file, tmp_path):
    path, data = data_file
    with pytest.raises(ValueError, match="whole number"):
        ferry.load(path, np.float64, device="cpu")  # 8 MiB + 12345 is odd
    small = tmp_path / "small.bin"
    small.write_bytes(b"1234")
    with pytest.raises(EOFError):
        ferry.read_into(small, np.empty(8, np.uint8))
    with pytest.raises(ValueError, match="device"):
        ferry.load(path, np.uint8, device="gpu0")


def test_buffer_info_names_the_exporter():
    a = np.zeros(10, np.float32)
    address, nbytes, exporter = ferry._ferry.buffer_info(a)
    assert (address, nbytes, exporter) == (a.ctypes.data, 40, "buffer")


def test_threads_share_one_file(data_file):
    from concurrent.futures import ThreadPoolExecutor

    path, data = data_file
    rng = random.Random(9)
    jobs = [(rng.randrange(len(data) - 4096), rng.randrange(1, 4096)) for _ in range(200)]

    with ferry.open(path) as f:
        def one(job):
            offset, size = job
            buf = bytearray(size)
            assert f.read(buf, file_offset=offset) == size
            return bytes(buf) == data[offset:offset + size]

        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(one, jobs))
