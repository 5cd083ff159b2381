"""GPU buffers, byte for byte against a host reference. Run on a machine with a GPU and CuPy
and/or PyTorch; elsewhere each test skips with the reason."""

import os
import random

import numpy as np
import pytest

import ferry

pytestmark = pytest.mark.gpu


def test_cupy_arrays_random_offsets_and_sizes(cupy, data_file):
    path, data = data_file
    rng = random.Random(11)
    with ferry.open(path) as f:
        for _ in range(20):
            offset = rng.randrange(len(data))
            size = rng.randrange(1, 4 << 20)
            a = cupy.zeros(size, cupy.uint8)
            n = f.read(a, file_offset=offset)
            assert n == min(size, len(data) - offset)
            assert cupy.asnumpy(a[:n]).tobytes() == data[offset:offset + n]
        assert f.last_route.memory in ("gpu", "gpu-managed")


def test_cupy_contiguous_slice_and_non_contiguous_error(cupy, data_file):
    path, data = data_file
    a = cupy.zeros((64, 4096), cupy.float32)
    with ferry.open(path) as f:
        assert f.read(a[8:24], file_offset=100) == 16 * 4096 * 4
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.read(a[:, ::2])
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.read(a.T)
    host = cupy.asnumpy(a)
    assert host[8:24].tobytes() == data[100:100 + 16 * 4096 * 4]
    assert not host[:8].any() and not host[24:].any()


def test_torch_tensors_contiguous_sliced_and_non_contiguous(torch, data_file):
    path, data = data_file
    t = torch.zeros((256, 1024), dtype=torch.int16, device="cuda")
    with ferry.open(path) as f:
        assert f.read(t) == t.numel() * 2
        assert t.cpu().numpy().tobytes() == data[:t.numel() * 2]
        t.zero_()
        assert f.read(t[3:7], file_offset=12345) == 4 * 1024 * 2
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.read(t[:, 1:3])
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.read(t.t())
    host = t.cpu().numpy()
    assert host[3:7].tobytes() == data[12345:12345 + 4 * 1024 * 2]
    assert not host[:3].any() and not host[7:].any()


def test_async_futures_into_gpu_memory(cupy, data_file):
    path, data = data_file
    chunk = 1 << 20
    with ferry.open(path) as f:
        # Arrays referenced only by their futures stay alive until the reads end.
        orphans = [f.pread(cupy.empty(chunk, cupy.uint8), file_offset=i * chunk) for i in range(8)]
        assert sum(fut.result() for fut in orphans) == 8 * chunk
        targets = [cupy.empty(chunk, cupy.uint8) for _ in range(8)]
        futures = [f.pread(t, file_offset=i * chunk) for i, t in enumerate(targets)]
        assert [fut.result(timeout=60) for fut in futures] == [chunk] * 8
        assert all(fut.done() for fut in futures)
        assert futures[0].last_route.memory in ("gpu", "gpu-managed")
    for i, t in enumerate(targets):
        assert cupy.asnumpy(t).tobytes() == data[i * chunk:(i + 1) * chunk]


def test_write_from_gpu_memory(cupy, tmp_path):
    src = cupy.arange(1 << 20, dtype=cupy.uint32)
    path = tmp_path / "gpu_out.bin"
    with ferry.open(path, "w") as f:
        assert f.write(src) == src.nbytes
    assert path.read_bytes() == cupy.asnumpy(src).tobytes()


def test_load_into_cupy(cupy, data_file):
    path, data = data_file
    a = ferry.load(path, np.uint8, like="cupy")
    assert isinstance(a, cupy.ndarray) and cupy.asnumpy(a).tobytes() == data
    assert ferry.last_route().memory in ("gpu", "gpu-managed")
    default = ferry.load(path, np.uint8)
    assert not isinstance(default, np.ndarray)  # a GPU framework is preferred when one works


def test_load_into_torch(torch, data_file):
    path, data = data_file
    t = ferry.load(path, "<i2", shape=(1024, 64), like=torch)
    assert t.is_cuda and t.shape == (1024, 64) and t.dtype == torch.int16
    assert t.cpu().numpy().tobytes() == data[:1024 * 64 * 2]


def test_one_gib_read_as_in_the_article(cupy, tmp_path):
    """The article's case: a 1 GiB file read into a GPU array; 256 tasks of 4 MiB."""
    path = tmp_path / "1GiB.bin"
    rng = np.random.default_rng(1)
    reference = rng.integers(0, 255, 1 << 30, dtype=np.uint8)
    reference.tofile(path)
    a = cupy.empty(1 << 30, cupy.uint8)
    with ferry.open(path) as f:
        assert f.read(a) == 1 << 30
        route = f.last_route
    print(route)
    assert route.tasks == 256 and route.bytes == 1 << 30
    assert route.memory in ("gpu", "gpu-managed")
    assert route.verdict and str(route).startswith("route: ")
    assert np.array_equal(cupy.asnumpy(a), reference)
    os.remove(path)


def test_route_report_for_a_gpu_read(cupy, data_file):
    path, _ = data_file
    with ferry.settings(compat="on"):
        with ferry.open(path) as f:
            f.read(cupy.empty(1 << 20, cupy.uint8))
            r = f.last_route
    assert r.cufile_tasks == 0 and r.posix_tasks == r.tasks
    assert "compat_mode_on" in [x.code for x in r.reasons]
    assert r.device == 0


def test_registered_buffer_reads_match(cupy, data_file):
    path, data = data_file
    status = ferry.cufile_status()
    if not status["driver_open"]:
        pytest.skip(f"cuFile driver not open: {status['load_error'] or status['driver_error_text']}")
    a = cupy.zeros(4 << 20, cupy.uint8)
    with ferry.register_buffer(a) as reg, ferry.open(path) as f:
        assert reg.registered and reg.size == a.nbytes
        f.read(a[1 << 20:], file_offset=10)
        print(f.last_route)
    assert cupy.asnumpy(a[1 << 20:]).tobytes() == data[10:10 + (3 << 20)]


def test_warm_up_then_first_read_is_exact(cupy, data_file):
    """Issue 9: warm_up() prepares the staging; the read after it is exact and says where it went."""
    ferry.warm_up(0)
    ferry.warm_up(0)  # a second call costs nothing and must not fail
    path, data = data_file
    a = cupy.empty(len(data), dtype=cupy.uint8)
    ferry.read_into(path, a)
    assert bytes(a.get()) == data
    r = ferry.last_route()
    assert r.page_cache.known and r.page_cache.bytes == len(data)
    assert r.workers >= 1
