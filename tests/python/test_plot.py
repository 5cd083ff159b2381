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
    # The x labels sit under each column's lowest panel: the ratio panels here (--compare).
    assert [ax.get_xlabel() for ax in fig.axes[2:]] == ["request size", "threads"]
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
    # The ceiling does not set the scale: the reads fill the panel, the ceiling is named.
    assert fig.axes[0].get_ylim()[1] < 4.0
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("above the scale" in t and "9.0 GB/s" in t for t in texts), texts


def test_a_ceiling_within_the_scale_is_not_named(tmp_path):
    records = [_record(gbps=3.0), _record(case="ceiling", route="memcpy", gbps=3.2)]
    fig = plot.figure(records)
    assert fig.axes[0].get_ylim()[1] >= 3.2
    assert not fig.axes[0].texts


def test_ferry_and_its_baseline_share_a_colour_and_the_ratio_is_drawn_below(bench_results):
    fig = plot.figure(plot.load([str(bench_results)]))
    by_size, _, size_ratio, threads_ratio = fig.axes
    lines = {l.get_label(): l for l in by_size.get_lines()}
    for threads in (1, 2):
        ferry = lines[f"ferry auto, host, threads {threads}"]
        assert lines[f"pread baseline, host, threads {threads}"].get_color() == ferry.get_color()
        assert lines[f"ceiling (memcpy), host, threads {threads}"].get_color() == ferry.get_color()
        assert lines[f"ferry posix, host, threads {threads}"].get_color() == ferry.get_color()
    assert lines["ferry auto, host, threads 1"].get_color() != \
        lines["ferry auto, host, threads 2"].get_color()
    assert size_ratio.get_ylabel() == threads_ratio.get_ylabel() == "ferry / baseline"
    records = plot.load([str(bench_results)])
    want = sorted(r["ratio"] for r in records if r["case"] == "ferry" and r["threads"] == 1
                  and r["route"] == "auto")
    ratio = next(l for l in size_ratio.get_lines() if l.get_label() == "ferry auto, host, threads 1")
    assert sorted(ratio.get_ydata()) == pytest.approx(want)
    assert any(list(l.get_ydata()) == [1.0, 1.0] for l in size_ratio.get_lines()), "the 1.0 line"


def test_without_a_baseline_there_is_no_ratio_panel():
    fig = plot.figure([_record(io_size=4096), _record(io_size=1 << 20, gbps=2.0)])
    assert len(fig.axes) == 2


def _bench(*args, env=None):
    tool = cli.find_cli()
    if tool is None:
        pytest.skip("no ferry tool built or on PATH")
    return subprocess.run([tool, "bench", *args], capture_output=True, text=True, timeout=180,
                          env=env)


def test_bench_plot_draws_the_run_and_keeps_its_results(tmp_path):
    out = tmp_path / "run.png"
    done = _bench("-D", str(tmp_path), "-s", "4MiB", "--total", "2MiB", "-i", "64KiB,1MiB",
                  "--memory", "host", "--compare", "--ceiling", "--plot", str(out))
    assert done.returncode == 0, done.stderr + done.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = plot.load([str(tmp_path / "run.jsonl")])
    assert sorted(r["case"] for r in results) == ["baseline"] * 2 + ["ceiling"] * 2 + ["ferry"] * 2
    assert f"plot: {out} (its results: {tmp_path / 'run.jsonl'})" in done.stdout
    assert "GB/s" in done.stdout  # the table is still printed
    assert not list(tmp_path.glob("ferry-bench.*")), "the temporary file is removed"


def test_bench_plot_with_json_keeps_stdout_for_the_json_lines(tmp_path):
    out = tmp_path / "run.svg"
    done = _bench("-D", str(tmp_path), "-s", "4MiB", "--total", "2MiB", "--memory", "host",
                  "--json", "--plot", str(out))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and all(json.loads(line)["case"] == "ferry" for line in lines)
    assert "plot: " in done.stderr and out.read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize("name, env_python, message", [
    ("run.txt", None, "--plot '{out}': expected a file name ending in .png, .svg or .pdf"),
    ("missing/run.png", None, "--plot '{out}': no folder"),
    ("run.png", "/bin/false", "--plot needs a Python interpreter with matplotlib, and "
                              "FERRY_PYTHON=/bin/false has none"),
])
def test_bench_plot_that_cannot_be_drawn_fails_before_measuring(tmp_path, name, env_python,
                                                                message):
    out = tmp_path / name
    env = dict(os.environ)
    env.pop("FERRY_PYTHON", None)
    if env_python:
        env["FERRY_PYTHON"] = env_python
    done = _bench("-D", str(tmp_path), "-s", "4MiB", "--memory", "host", "--plot", str(out),
                  env=env)
    assert done.returncode != 0
    assert message.format(out=out) in done.stderr
    assert "GB/s" not in done.stdout, "nothing was measured"
    assert not out.exists() and not list(tmp_path.glob("ferry-bench.*"))


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
