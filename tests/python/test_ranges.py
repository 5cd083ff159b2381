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
