"""Progress (issue 47, item 5): the CLI's line on a terminal (bytes, rate, ETA; none in a pipe or
with --json), drawn for a slow remote read as its bytes arrive, and the ``progress=`` argument of
the Python loads and saves: a callable called from the documented thread, done never going down
and ending at the total, its exception ending the load or save (a save leaving the old
checkpoint whole)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ferry
import ferry.safetensors.numpy as stnp
from ferry import _progress

CLI = os.environ.get("FERRY_CLI")
# A frame of the CLI's line: "\r<label>  <done> / <total>  NN%  <rate>  ETA <eta>\033[K".
FRAME = re.compile(r"\r(\w+)  ([\d.]+ \w?i?B) / ([\d.]+ \w?i?B) +(\d+)%  ([\d.]+ [kMG]?B/s|-- B/s)"
                   r"  ETA (\S+)\x1b\[K")


def _tensors(count: int = 6, size: int = 1 << 16, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"layer.{i}.w": rng.integers(0, 255, size, dtype=np.uint8) for i in range(count)}


def _recorder():
    calls: list[tuple[int, int, int]] = []

    def progress(done: int, total: int) -> None:
        calls.append((done, total, threading.get_ident()))
    return calls, progress


def _check_calls(calls, total: int) -> None:
    assert calls, "the callback was never called"
    dones = [d for d, _, _ in calls]
    assert dones == sorted(dones), f"done went down: {dones}"
    assert all(t == total for _, t, _ in calls), calls
    assert dones[-1] == total


# --- the line's formatting ---------------------------------------------------------------


def test_the_python_line_reads_as_the_clis():
    assert (_progress.progress_line("reading", 2 << 30, 8 << 30, 1.0)
            == "reading  2.00 GiB / 8.00 GiB   25%  2.15 GB/s  ETA 3s")
    assert _progress.progress_line("l", 10**6, 66 * 10**6, 1.0).endswith("ETA 1m05s")
    assert _progress.progress_line("l", 10**6, 7381 * 10**6, 1.0).endswith("ETA 2h03m")
    assert _progress.progress_line("l", 10**6, 10**6 + 1, 1.0).endswith(" 99%  1.00 MB/s  ETA 1s")
    assert _progress.progress_line("reading", 12 << 20, 0, 2.0) == "reading  12.0 MiB  6.29 MB/s"
    assert (_progress.progress_line("loading", 0, 8 << 30, 0.4)
            == "loading  0 B / 8.00 GiB    0%  -- B/s  ETA --")


def test_progress_true_draws_on_a_terminal_only(monkeypatch, tmp_path):
    class Terminal:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    # ferry's own line: tqdm hidden, and its submodule too where another test imported it.
    monkeypatch.setitem(__import__("sys").modules, "tqdm", None)
    monkeypatch.setitem(__import__("sys").modules, "tqdm.auto", None)
    bar = _progress.reporter(True, "loading")
    assert isinstance(bar, _progress.TextBar)
    bar(0, 100)
    assert term.text == ""  # nothing for the first moment
    time.sleep(0.35)
    bar(50, 100)
    assert "loading  50 B / 100 B   50%" in term.text and "ETA" in term.text
    _progress.close(bar)
    assert term.text.endswith("\r\x1b[K")

    class Pipe(Terminal):
        def isatty(self):
            return False

    monkeypatch.setattr("sys.stderr", Pipe())
    assert _progress.reporter(True, "loading") is None
    path = tmp_path / "m.safetensors"
    stnp.save_file(_tensors(), path, progress=True)
    assert set(stnp.load_file(path, progress=True)) == set(_tensors())


def test_a_progress_that_is_not_a_bool_or_callable_is_refused_before_any_work(tmp_path):
    with pytest.raises(TypeError, match="progress must be True, False, None or a callable"):
        ferry.save_checkpoint(_tensors(), tmp_path / "c", progress="yes")
    assert not (tmp_path / "c").exists()
    stnp.save_file(_tensors(), tmp_path / "m.safetensors")
    with pytest.raises(TypeError, match="not int"):
        ferry.load_checkpoint(tmp_path / "m.safetensors", framework="numpy", progress=1)


# --- loads -------------------------------------------------------------------------------


@pytest.mark.parametrize("one_allocation", [False, True])
def test_a_load_reports_from_the_calling_thread_up_to_the_total(tmp_path, one_allocation):
    tensors = _tensors(count=9)
    ferry.save_checkpoint(tensors, tmp_path, max_shard_size=3 << 16)
    calls, progress = _recorder()
    loaded = ferry.load_checkpoint(tmp_path, framework="numpy", one_allocation=one_allocation,
                                   progress=progress)
    _check_calls(calls, sum(t.nbytes for t in tensors.values()))
    assert {tid for _, _, tid in calls} == {threading.get_ident()}
    for name, t in tensors.items():
        assert np.array_equal(loaded[name], t)
    # Only the named tensors count.
    calls, progress = _recorder()
    ferry.load_checkpoint(tmp_path, framework="numpy", names=["layer.2.w"], progress=progress)
    _check_calls(calls, tensors["layer.2.w"].nbytes)


def test_safetensors_load_file_takes_progress(tmp_path):
    torch = pytest.importorskip("torch")
    import ferry.safetensors.torch as sttorch
    tensors = {"a": torch.arange(1000, dtype=torch.float32), "b": torch.ones(7, dtype=torch.int64)}
    sttorch.save_file(tensors, tmp_path / "m.safetensors")
    calls, progress = _recorder()
    loaded = sttorch.load_file(tmp_path / "m.safetensors", progress=progress)
    _check_calls(calls, 4000 + 56)
    assert torch.equal(loaded["a"], tensors["a"])


def test_an_exception_in_the_load_callback_propagates(tmp_path):
    ferry.save_checkpoint(_tensors(), tmp_path, max_shard_size=2 << 16)

    class Stop(Exception):
        pass

    def progress(done, total):
        raise Stop("stop loading")

    for one in (False, True):
        with pytest.raises(Stop, match="stop loading"):
            ferry.load_checkpoint(tmp_path, framework="numpy", one_allocation=one,
                                  progress=progress)
    assert set(ferry.load_checkpoint(tmp_path, framework="numpy")) == set(_tensors())


# --- saves -------------------------------------------------------------------------------


def _shard_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.safetensors"))


def test_a_save_reports_every_shard_byte_from_the_saving_thread(tmp_path):
    calls, progress = _recorder()
    ferry.save_checkpoint(_tensors(), tmp_path, max_shard_size=2 << 16, progress=progress)
    _check_calls(calls, _shard_bytes(tmp_path))
    assert {tid for _, _, tid in calls} == {threading.get_ident()}
    # Asynchronous: from ferry's save thread, the future's result the same report.
    calls, progress = _recorder()
    future = ferry.save_checkpoint(_tensors(seed=1), tmp_path / "later", asynchronous=True,
                                   progress=progress)
    future.result()
    _check_calls(calls, _shard_bytes(tmp_path / "later"))
    assert threading.get_ident() not in {tid for _, _, tid in calls}
    calls, progress = _recorder()
    stnp.save_file(_tensors(), tmp_path / "one.safetensors", progress=progress)
    _check_calls(calls, (tmp_path / "one.safetensors").stat().st_size)


@pytest.mark.parametrize("when", ["first call", "last call"])
def test_a_save_stopped_by_its_callback_leaves_the_old_checkpoint_whole(tmp_path, when):
    old = _tensors(count=4, seed=1)
    ferry.save_checkpoint(old, tmp_path, max_shard_size=2 << 16)
    stnp.save_file(old, tmp_path / "single.safetensors")
    before = sorted(p.name for p in tmp_path.iterdir())
    single = (tmp_path / "single.safetensors").read_bytes()

    class Stop(Exception):
        pass

    def progress(done, total):
        if when == "first call" or done == total:
            raise Stop(f"stopped at {done} of {total}")

    with pytest.raises(Stop, match="stopped at"):
        ferry.save_checkpoint(_tensors(count=8, seed=2), tmp_path, max_shard_size=2 << 16,
                              progress=progress)
    with pytest.raises(Stop):
        stnp.save_file(_tensors(count=8, seed=2), tmp_path / "single.safetensors",
                       progress=progress)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary file either
    assert (tmp_path / "single.safetensors").read_bytes() == single
    loaded = ferry.load_checkpoint(tmp_path / "model.safetensors.index.json", framework="numpy")
    assert set(loaded) == set(old)
    for name, t in old.items():
        assert np.array_equal(loaded[name], t)


# --- the CLI under a pseudo-terminal -------------------------------------------------------


def _run_on_a_terminal(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    """Runs the CLI with stderr on a pseudo-terminal (stdout a pipe): (status, stdout, what the
    terminal received)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([CLI, *args], stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed its side
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    out = proc.stdout.read().decode() if proc.stdout else ""
    return proc.wait(timeout=timeout), out, seen.decode(errors="replace")


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    """An 8 MiB file and a 6 MiB checkpoint on nginx sending each response at 1 MiB/s after
    its first second's 1 MiB (nginx's limit_rate lets a response start with a second's worth)."""
    if not CLI:
        pytest.skip("FERRY_CLI (the built ferry tool) is not set")
    if not ferry.remote_support()[0]:
        pytest.skip(f"no libcurl: {ferry.remote_support()[1]}")
    import remote_servers as rs
    root = tmp_path_factory.mktemp("slow")
    (root / "data.bin").write_bytes(os.urandom(8 << 20))
    ferry.save_checkpoint(_tensors(count=6, size=1 << 20), root / "ckpt", max_shard_size=2 << 20)
    cm = rs.nginx_server(root, limit_rate="1m")
    try:
        url = cm.__enter__()
    except rs.ServerUnavailable as e:
        pytest.skip(str(e))
    try:
        yield url
    finally:
        cm.__exit__(None, None, None)


# 2 MiB tasks, two at a time: an 8 MiB read takes about 2 s, its bytes landing a task at a time.
SLOW = ("--host", "--task-size", "2MiB", "--threads", "2")


def test_a_remote_read_on_a_terminal_shows_bytes_rate_and_eta_as_they_arrive(slow_server):
    status, out, term = _run_on_a_terminal("read", f"{slow_server}/data.bin", *SLOW)
    assert status == 0, term
    frames = FRAME.findall(term)
    assert frames, f"no progress line on the terminal: {term!r}"
    assert {f[0] for f in frames} == {"reading"}
    assert all(f[2] == "8.00 MiB" for f in frames)
    # The remote source's bytes are counted as they land (a task at a time), not all at the end:
    # a frame shows some of them, neither none nor all.
    dones = [f[1] for f in frames]
    assert set(dones) - {"0 B", "8.00 MiB"}, dones
    assert any(f[4] != "-- B/s" for f in frames) and any(f[5] != "--" for f in frames), frames
    assert term.endswith("\r\x1b[K")  # erased before the report (on stdout)
    assert "read 8388608 B" in out


def test_a_checkpoint_load_on_a_terminal_shows_progress(slow_server):
    status, out, term = _run_on_a_terminal("load", f"{slow_server}/ckpt", *SLOW)
    assert status == 0, term
    frames = FRAME.findall(term)
    assert frames and {f[0] for f in frames} == {"loading"}, term
    assert all(f[2] == "6.00 MiB" for f in frames)
    assert "loaded 6 tensors" in out


def test_no_progress_line_in_a_pipe_or_with_json(slow_server):
    r = subprocess.run([CLI, "read", f"{slow_server}/data.bin", *SLOW], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ETA" not in r.stderr and "\r" not in r.stderr
    status, out, term = _run_on_a_terminal("read", f"{slow_server}/data.bin", *SLOW, "--json")
    assert status == 0, term
    assert "ETA" not in term and "\r\x1b[K" not in term
    assert '"bytes": 8388608' in out


def test_bench_draws_its_line_on_a_terminal_but_none_with_json(tmp_path):
    if not CLI:
        pytest.skip("FERRY_CLI (the built ferry tool) is not set")
    data = tmp_path / "bench.bin"
    data.write_bytes(os.urandom(8 << 20))
    args = ("bench", "-f", str(data), "--memory", "host", "--time", "1")
    status, out, term = _run_on_a_terminal(*args)
    assert status == 0, term
    # A timed case: bytes so far, the percentage and time left by the clock, the rate.
    assert re.search(r"\r.+  [\d.]+ \w?i?B +\d+%  [\d.]+ [kMG]?B/s  ETA \d+s\x1b\[K", term), term
    status, out, term = _run_on_a_terminal(*args, "--json")
    assert status == 0, term
    assert "\r" not in term and "ETA" not in term, term  # it drew a bar with --json before
