"""File.read_ranges: many ranges of a file into one buffer in one request (issue 14)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import ferry


@pytest.fixture()
def rows_file(tmp_path):
    data = np.random.default_rng(5).integers(0, 256, 1024 * 4096, dtype=np.uint8)
    path = tmp_path / "rows.bin"
    data.tofile(path)
    return path, data


def test_random_rows_from_an_array_of_ranges_match_the_file(rows_file):
    path, data = rows_file
    rng = np.random.default_rng(6)
    rows = rng.integers(0, 1024, 5000)
    ranges = np.stack([rows * 4096, np.full(5000, 4096), np.arange(5000) * 4096], axis=1)
    out = np.zeros(5000 * 4096, np.uint8)
    with ferry.open(path) as f:
        assert f.read_ranges(out, ranges.astype(np.int64)) == out.nbytes
        r = f.last_route
    assert np.array_equal(out.reshape(5000, 4096), data.reshape(1024, 4096)[rows])
    assert r.ranges == 5000 and r.runs <= 5000


def test_tuples_and_adjacent_ranges_coalesce_and_futures_work(rows_file):
    path, data = rows_file
    out = bytearray(3 * 4096)
    ranges = [(0, 4096, 0), (4096, 4096, 4096), (100 * 4096 + 5, 10, 2 * 4096)]
    with ferry.open(path) as f:
        fut = f.pread_ranges(out, ranges)
        assert fut.result() == 2 * 4096 + 10
        assert fut.last_route.ranges == 3 and fut.last_route.runs == 2
    assert out[:8192] == data[:8192].tobytes()
    assert out[8192:8202] == data[100 * 4096 + 5:100 * 4096 + 15].tobytes()


def test_bad_ranges_are_clear_errors_before_any_io(rows_file):
    path, _ = rows_file
    out = np.full(8192, 0xEE, np.uint8)
    with ferry.open(path) as f:
        with pytest.raises(ValueError, match=r"\(n, 3\) array"):
            f.read_ranges(out, np.zeros((4, 2), np.int64))
        with pytest.raises(ValueError, match=r"ranges\[1\] has a negative value"):
            f.read_ranges(out, np.array([[0, 10, 0], [-1, 10, 0]], np.int64))
        with pytest.raises(ValueError, match=r"ranges\[0\] must be"):
            f.read_ranges(out, [(0, 10)])
        with pytest.raises(ferry.IoError, match="outside the buffer of 8192 B"):
            f.read_ranges(out, [(0, 4096, 8000)])
        with pytest.raises(ferry.IoError, match="past the end of the file"):
            f.read_ranges(out, [(os.path.getsize(path) - 1, 2, 0)])
    assert (out == 0xEE).all()


def test_write_ranges_scatters_rows_and_the_holes_stay_zero(tmp_path):
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, 300 * 4096, dtype=np.uint8)
    slots = rng.permutation(1000)[:300]  # 300 rows into 1000 slots of the file, in any order
    ranges = np.stack([slots * 4096, np.full(300, 4096), np.arange(300) * 4096], axis=1)
    path = tmp_path / "scatter.bin"
    with ferry.open(path, "w") as f:
        assert f.write_ranges(src, ranges.astype(np.int64)) == src.nbytes
        r = f.last_route
        assert r.op == "write" and r.ranges == 300
    out = np.fromfile(path, np.uint8)
    assert out.nbytes == (slots.max() + 1) * 4096
    table = out.reshape(-1, 4096)
    assert np.array_equal(table[slots], src.reshape(300, 4096))
    holes = np.setdiff1d(np.arange(len(table)), slots)
    assert not table[holes].any()


def test_pwrite_ranges_future_and_errors_before_any_io(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"x" * 10000)
    src = bytes(range(256)) * 16
    with ferry.open(path, "r+") as f:
        fut = f.pwrite_ranges(src, [(0, 100, 0), (100, 100, 100), (5000, 50, 200)])
        assert fut.result() == 250
        assert fut.last_route.ranges == 3 and fut.last_route.runs == 2
        with pytest.raises(ferry.IoError, match=r"overlaps range") as e:
            f.write_ranges(src, [(0, 100, 0), (50, 100, 100)])
        assert e.value.bytes_done == 0
        with pytest.raises(ferry.IoError, match=r"outside the buffer"):
            f.write_ranges(src, [(0, 100, len(src) - 50)])
    data = path.read_bytes()
    assert data[:200] == src[:200] and data[5000:5050] == src[200:250]
    assert data[200:5000] == b"x" * 4800, "nothing else was written"
    with ferry.open(path, "a") as f:
        with pytest.raises(ferry.IoError, match=r"not in append mode"):
            f.write_ranges(src, [(0, 10, 0)])
