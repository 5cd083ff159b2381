"""`python -m ferry.plot` on what `ferry bench --json` writes: a real host-memory sweep of this
machine, drawn to a PNG whose panels and lines are checked."""

import json
import os
import subprocess
import sys

import pytest

from ferry import __main__ as cli
from ferry import plot


def _run_plot(*args):
    return subprocess.run([sys.executable, "-m", "ferry.plot", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def bench_results(tmp_path_factory):
    """JSON lines of a short sweep: two request sizes, two thread counts, two routes, with the
    baseline and the ceiling."""
    tool = cli.find_cli()
    if tool is None:
        pytest.skip("no ferry tool built or on PATH")
    folder = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [tool, "bench", "--json", "-D", str(folder), "-s", "8MiB", "--total", "4MiB", "-i",
         "64KiB,1MiB", "-w", "1,2", "--memory", "host", "--route", "auto,posix", "--compare",
         "--ceiling"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr + done.stdout
    path = folder / "results.jsonl"
    path.write_text(done.stdout)
    return path


def test_bench_json_lines_are_results(bench_results):
    records = plot.load([str(bench_results)])
    # 2 routes x 2 thread counts x 2 sizes ferry cases; baseline and ceiling once per
    # (threads, size).
    cases = [r["case"] for r in records]
    assert cases.count("ferry") == 8
    assert cases.count("baseline") == 4
    assert cases.count("ceiling") == 4
    for r in records:
        assert r["gbps"] > 0 and r["iops"] > 0
        assert r["latency_us"]["p50"] <= r["latency_us"]["p99"] <= r["latency_us"]["p99_9"]
    assert {r["route"] for r in records if r["case"] == "ferry"} == {"auto", "posix"}


def test_plot_command_writes_a_png(bench_results, tmp_path):
    out = tmp_path / "out.png"
    done = _run_plot(str(bench_results), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.stat().st_size > 10000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "16 result(s)" in done.stdout


def test_axes_are_labelled_with_a_line_per_route_and_memory(bench_results):
    fig = plot.figure(plot.load([str(bench_results)]))
    by_size, by_threads = fig.axes[:2]
    assert by_size.get_xlabel() == "request size"
    assert by_threads.get_xlabel() == "threads"
    for ax in (by_size, by_threads):
        assert ax.get_ylabel() == "throughput (GB/s)"
        assert ax.get_title()
    size_labels = [line.get_label() for line in by_size.get_lines()]
    # ferry auto, ferry posix, the baseline and the ceiling, each for 1 and 2 threads.
    assert len(size_labels) == 8, size_labels
    assert "ferry auto, host, threads 1" in size_labels
    assert "ferry posix, host, threads 2" in size_labels
    assert "pread baseline, host, threads 1" in size_labels
    assert "ceiling (memcpy), host, threads 2" in size_labels
    thread_labels = [line.get_label() for line in by_threads.get_lines()]
    assert "ferry posix, host, request size 64 KiB" in thread_labels
    assert "ferry auto, host, request size 1 MiB" in thread_labels
    line = next(l for l in by_size.get_lines() if l.get_label() == "ferry auto, host, threads 2")
    assert list(line.get_xdata()) == [64 << 10, 1 << 20]


def _record(**fields):
    base = {"case": "ferry", "mode": "read", "io_size": 1 << 20, "threads": 1, "memory": "host",
            "route": "auto", "gbps": 1.0, "iops": 1.0}
    return {**base, **fields}


def test_one_ceiling_value_is_drawn_across(tmp_path):
    records = [_record(io_size=4096, gbps=1.0), _record(io_size=1 << 20, gbps=3.0),
               _record(case="ceiling", route="memcpy", gbps=9.0, io_size=1 << 20)]
    fig = plot.figure(records)
    ceiling = [l for l in fig.axes[0].get_lines() if l.get_label().startswith("ceiling")]
    assert len(ceiling) == 1
    assert list(ceiling[0].get_ydata()) == [9.0, 9.0], "a horizontal line at the ceiling"


def test_failed_cases_and_blank_lines_are_left_out(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([json.dumps(_record()), "",
                               json.dumps(_record(route="cufile", error="refused"))]) + "\n")
    records = plot.load([str(path)])
    assert [r["route"] for r in records] == ["auto"]


def test_not_json_names_the_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_record()) + "\nferry bench: read of ...\n")
    done = _run_plot(str(path), "-o", str(tmp_path / "x.png"))
    assert done.returncode == 1
    assert f"{path}:2: not a JSON line" in done.stderr
    assert not os.path.exists(tmp_path / "x.png")


def test_nothing_to_plot_is_an_error(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_record(error="refused")) + "\n")
    done = _run_plot(str(path), "-o", str(tmp_path / "x.png"))
    assert done.returncode == 1
    assert "no results to plot" in done.stderr
