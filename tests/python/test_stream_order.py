"""Stream-ordered reads and writes (``File.read_async``/``write_async``, and ``ferry.kvikio``'s
stream-taking calls over them). Without a CUDA driver they fail with a clear CudaError; on the
GPU machine, kernels on the stream before and after a read must see it in stream order."""

import random

import numpy as np
import pytest

import ferry
from ferry._streams import stream_handle


def _no_driver():
    return not ferry.cuda_status().available


def test_stream_handles_of_every_kind():
    class Cupy:
        ptr = 1234

    class Torch:
        cuda_stream = 99

    class Protocol:
        def __cuda_stream__(self):
            return (0, 77)

    assert stream_handle(None) == 0 and stream_handle(5) == 5
    assert stream_handle(Cupy()) == 1234 and stream_handle(Torch()) == 99
    assert stream_handle(Protocol()) == 77
    with pytest.raises(TypeError, match="stream must be an int"):
        stream_handle("stream")


@pytest.mark.skipif(not _no_driver(), reason="a CUDA driver is present: the GPU tests cover it")
def test_read_async_without_a_driver_is_a_cuda_error_and_reads_nothing(tmp_path):
    path = tmp_path / "f.bin"
    data = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
    data.tofile(path)
    buf = np.full(1 << 20, 0xEE, dtype=np.uint8)
    with ferry.open(path, "r+") as f:
        fut = f.read_async(buf, stream=None)
        with pytest.raises(ferry.CudaError, match="CUDA driver"):
            fut.result()
        assert (buf == 0xEE).all()
        with pytest.raises(ferry.CudaError):
            f.write_async(buf, stream=0).result()
    assert np.array_equal(np.fromfile(path, dtype=np.uint8), data)


def test_read_async_refuses_a_bad_stream_argument(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 100)
    with ferry.open(tmp_path / "f") as f:
        with pytest.raises(TypeError, match="stream must be"):
            f.read_async(bytearray(100), stream=1.5)


# ---- on the GPU machine ----------------------------------------------------------------------

def _file(tmp_path, size, seed):
    path = tmp_path / "data.bin"
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    data.tofile(path)
    return path, data


@pytest.mark.gpu
@pytest.mark.parametrize("task_size", [None, "256KiB"], ids=["default-tasks", "many-tasks"])
@pytest.mark.parametrize("own_stream", [True, False], ids=["own-stream", "default-stream"])
def test_read_async_lands_between_kernels_in_stream_order(tmp_path, torch, own_stream, task_size):
    """A kernel fills the buffer (after a random GPU-side sleep), read_async overwrites it, a
    kernel copies it out: every copy must hold the file's bytes. Rounds are queued back to back
    without synchronising; with many tasks per read, later reads' jobs hold the threads while
    they wait for the GPU."""
    size, n = 64 << 20, (4 << 20) + 12345
    path, data = _file(tmp_path, size, 11)
    rng = random.Random(12)
    stream = torch.cuda.Stream() if own_stream else torch.cuda.default_stream()
    rounds = []
    settings = {"task_size": task_size} if task_size else {}
    with ferry.open(path, **settings) as f:
        for _ in range(40):
            buf = torch.empty(n, dtype=torch.uint8, device="cuda")
            offset = rng.randrange(0, size - n)
            with torch.cuda.stream(stream):
                torch.cuda._sleep(rng.randrange(0, 3_000_000))  # GPU cycles: up to ~1.5 ms
                buf.fill_(0xAA)
            fut = f.read_async(buf, stream=stream, file_offset=offset)
            with torch.cuda.stream(stream):
                out = buf.clone()
            rounds.append((offset, fut, out))
        stream.synchronize()
        for i, (offset, fut, out) in enumerate(rounds):
            assert fut.result() == n
            got = out.cpu().numpy()
            assert np.array_equal(got, data[offset:offset + n]), (
                f"round {i}: the kernel after read_async saw other bytes (first {got[0]:#x}; "
                f"0xaa: the read landed before the fill, or the copy ran before the read)")
        assert "stream-ordered" in rounds[-1][1].last_route.to_text()


@pytest.mark.gpu
def test_read_async_does_not_block_the_caller(tmp_path, torch):
    """With the stream asleep for about a second, read_async returns at once and the read has
    not completed: the stream starts it once its earlier work has run."""
    path, data = _file(tmp_path, 8 << 20, 13)
    stream = torch.cuda.Stream()
    buf = torch.zeros(8 << 20, dtype=torch.uint8, device="cuda")
    with ferry.open(path) as f:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(2_000_000_000)
        fut = f.read_async(buf, stream=stream)
        assert not fut.done() and not stream.query()
        assert fut.result() == buf.numel()
        stream.synchronize()
    assert np.array_equal(buf.cpu().numpy(), data)


@pytest.mark.gpu
def test_write_async_writes_what_the_earlier_kernel_made(tmp_path, torch):
    n = (16 << 20) + 7
    stream = torch.cuda.Stream()
    src = torch.arange(n, dtype=torch.int64, device="cuda").to(torch.uint8)
    buf = torch.empty(n, dtype=torch.uint8, device="cuda")
    with ferry.open(tmp_path / "w.bin", "w") as f:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(20_000_000)
            buf.copy_(src)
        fut = f.write_async(buf, stream=stream)
        with torch.cuda.stream(stream):
            buf.fill_(0xAA)  # after the write has read the buffer
        assert fut.result() == n
        stream.synchronize()
    assert np.array_equal(np.fromfile(tmp_path / "w.bin", dtype=np.uint8), src.cpu().numpy())
