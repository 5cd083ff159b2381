"""``await f.aread(...)`` and ``await f.awrite(...)`` on ferry.File (issue 16): they never block
the event loop, not even for the small requests that ferry runs in the submitting thread."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

import ferry

SLOW = 0.5  # seconds the slow file's submissions take


class SlowFile(ferry.File):
    """A file whose reads take SLOW seconds to start, in the thread that starts them: what a
    small read (ferry runs reads up to 64 KiB in the calling thread) costs on slow storage (a
    cold disk, NFS)."""

    def pread(self, buf, size=None, file_offset=0):  # type: ignore[override]
        time.sleep(SLOW)
        return super().pread(buf, size, file_offset)

    def pwrite(self, buf, size=None, file_offset=0):  # type: ignore[override]
        time.sleep(SLOW)
        return super().pwrite(buf, size, file_offset)


async def _largest_gap(start):
    """(the result of awaiting start(), the longest time the loop went without running a 5 ms
    ticker meanwhile)."""
    gaps = []
    stop = asyncio.Event()

    async def tick():
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.02)
    try:
        result = await start()
    finally:
        stop.set()
        await ticker
    return result, max(gaps)


def test_aread_awrite_round_trip(tmp_path):
    data = np.random.default_rng(1).integers(0, 255, (8 << 20) + 5, dtype=np.uint8)

    async def main():
        with ferry.open(tmp_path / "f", "w+") as f:
            assert await f.awrite(data) == data.nbytes
            out = np.empty_like(data)
            assert await f.aread(out) == out.nbytes
            assert f.last_route.op == "read" and f.last_route.bytes == data.nbytes
            part = np.empty(100, np.uint8)
            assert await f.aread(part, 100, file_offset=1000) == 100
            return out, part

    out, part = asyncio.run(main())
    assert np.array_equal(out, data) and np.array_equal(part, data[1000:1100])


def test_aread_does_not_block_the_loop_on_a_slow_read(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(4096))

    async def main():
        with SlowFile(str(path)) as f:
            buf = bytearray(4096)
            start = time.monotonic()
            n, gap = await _largest_gap(lambda: f.aread(buf))
            took = time.monotonic() - start
            # The same read awaited as a plain Future: its submission runs in the loop's thread.
            _, blocked = await _largest_gap(lambda: _plain(f))
            return n, gap, took, bytes(buf), blocked

    n, gap, took, got, blocked = asyncio.run(main())
    assert n == 4096 and got == path.read_bytes()
    assert took >= SLOW
    assert gap < SLOW / 3, f"the loop stalled {gap:.3f} s during aread"
    assert blocked >= SLOW * 0.9, f"the control did not block ({blocked:.3f} s): the test proves nothing"


async def _plain(f):
    return await f.pread(bytearray(4096))


def test_awrite_does_not_block_the_loop(tmp_path):
    async def main():
        with SlowFile(str(tmp_path / "f"), "w") as f:
            return await _largest_gap(lambda: f.awrite(b"x" * 1000))

    n, gap = asyncio.run(main())
    assert n == 1000 and gap < SLOW / 3
    assert (tmp_path / "f").read_bytes() == b"x" * 1000


def test_a_real_large_read_keeps_the_loop_running(tmp_path):
    data = os.urandom(64 << 20)
    (tmp_path / "f").write_bytes(data)

    async def main():
        with ferry.open(tmp_path / "f", host_nthreads=1, task_size="64MiB") as f:
            out = bytearray(len(data))
            n, gap = await _largest_gap(lambda: f.aread(out))
            return n, gap, out

    n, gap, out = asyncio.run(main())
    assert n == len(data) and out == data
    assert gap < 0.25


def test_many_concurrent_areads(tmp_path):
    data = os.urandom(1 << 20)
    (tmp_path / "f").write_bytes(data)

    async def main():
        with ferry.open(tmp_path / "f") as f:
            bufs = [bytearray(4096) for _ in range(64)]
            counts = await asyncio.gather(*(f.aread(b, file_offset=i * 4096)
                                            for i, b in enumerate(bufs)))
            return counts, bufs

    counts, bufs = asyncio.run(main())
    assert counts == [4096] * 64
    assert b"".join(bufs) == data[:64 * 4096]


def test_the_callers_settings_scope_applies(tmp_path):
    (tmp_path / "f").write_bytes(os.urandom(1 << 20))

    async def main():
        with ferry.open(tmp_path / "f") as f:
            with ferry.settings(task_size="64KiB"):  # this thread's scope, the loop's
                await f.aread(bytearray(1 << 20))
            scoped = f.last_route.tasks
            await f.aread(bytearray(1 << 20))
            return scoped, f.last_route.tasks

    assert asyncio.run(main()) == (16, 1)


def test_errors_are_raised_in_the_awaiting_task(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")

    async def main():
        with ferry.open(tmp_path / "f", "r") as f:
            with pytest.raises(ferry.IoError):
                await f.awrite(b"xyz")
            with pytest.raises(ValueError, match="larger than the buffer"):
                await f.aread(bytearray(3), 10)
        with pytest.raises(ValueError, match="closed"):
            await f.aread(bytearray(3))

    asyncio.run(main())


def test_cancelling_an_aread_cancels_the_request_before_raising(tmp_path):
    (tmp_path / "f").write_bytes(os.urandom(4096))

    async def main():
        with SlowFile(str(tmp_path / "f")) as f:
            task = asyncio.create_task(f.aread(bytearray(4096)))
            await asyncio.sleep(SLOW / 5)  # the submission is under way in ferry's thread
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return f.in_flight  # nothing left running on the buffer

    assert asyncio.run(main()) == 0
