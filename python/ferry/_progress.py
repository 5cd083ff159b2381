"""Progress of loads and saves for Python callers: the ``progress=`` argument of
``ferry.load_checkpoint``, ``ferry.save_checkpoint`` and ``ferry.safetensors``' ``load_file`` and
``save_file`` (docs/checkpoints.md, "Progress").

``progress=True`` draws a line on stderr where stderr is a terminal, nothing elsewhere (a pipe, a
log file): tqdm's bar where tqdm can be imported, else ferry's own line, as the CLI draws it
("loading  3.20 GiB / 8.00 GiB  40%  2.45 GB/s  ETA 2s"). A callable is called as
``progress(done_bytes, total_bytes)``, ``done`` never going down and once equal to ``total`` at the
end (never after a failure), at most every 0.1 s: for a load from the thread that called it, while
it waits for the reads; for a save from the thread that runs the save (the caller's, or ferry's
save thread with ``asynchronous=True``). An exception it raises ends the load or save and
propagates: every read or write started has finished by then, and a save commits nothing (the
old file or checkpoint stays whole).
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Callable, Optional

from ._ferry import format_rate, format_size

Callback = Callable[[int, int], Any]

# As the CLI's line (tools/ferry/progress.cc): none for work shorter than this, then one frame
# per _REDRAW at most.
_FIRST_FRAME = 0.3
_REDRAW = 0.1


def eta_words(seconds: float) -> str:
    """Whole seconds, rounded up: "2s", "1m05s", "2h03m"."""
    s = int(math.ceil(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_line(label: str, done: int, total: int, seconds: float) -> str:
    """One line of progress, as the CLI's: `done` of `total` bytes (0: not known) after
    `seconds`, at the average rate since the start; "ETA --" while no byte has moved."""
    rate = done / seconds if seconds > 0 else 0.0
    line = f"{label}  {format_size(int(done), rounded=True)}"
    if total > 0:
        percent = math.floor(100 * min(done, total) / total)
        line += f" / {format_size(int(total), rounded=True)}  {percent:3d}%"
    line += "  " + (format_rate(rate) if rate > 0 else "-- B/s")
    if total > 0:
        line += "  ETA " + (eta_words((total - min(done, total)) / rate) if rate > 0 else "--")
    return line


class TextBar:
    """ferry's own line on `stream` (a terminal): first after a moment, redrawn every 0.1 s at
    most, erased by close()."""

    def __init__(self, label: str, stream: Any = None) -> None:
        self._label = label
        self._stream = stream if stream is not None else sys.stderr
        self._start = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        elapsed = now - self._start
        if elapsed < _FIRST_FRAME or (self._drawn and now - self._last < _REDRAW):
            return
        self._stream.write("\r" + progress_line(self._label, done, total, elapsed) + "\033[K")
        self._stream.flush()
        self._last, self._drawn = now, True

    def close(self) -> None:
        if self._drawn:
            self._stream.write("\r\033[K")
            self._stream.flush()
            self._drawn = False


class _TqdmBar:
    """tqdm's bar in bytes, made at the first call (when the total is known)."""

    def __init__(self, label: str, tqdm: Any) -> None:
        self._label, self._tqdm = label, tqdm
        self._bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            self._bar = self._tqdm(total=total, desc=self._label, unit="B", unit_scale=True,
                                   unit_divisor=1024, leave=False)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def check(progress: Any) -> None:
    """Refuses, before any work, a ``progress=`` that is neither a bool, None nor a callable."""
    if progress is None or isinstance(progress, bool) or callable(progress):
        return
    raise TypeError(f"ferry: progress must be True, False, None or a callable "
                    f"progress(done_bytes, total_bytes), not {type(progress).__name__}")


def reporter(progress: Any, label: str) -> Optional[Callback]:
    """The callable behind a ``progress=`` argument, or None for no progress: False and None
    mean none, True a bar on a terminal (None where stderr is not one), a callable itself."""
    check(progress)
    if progress is None or progress is False:
        return None
    if progress is True:
        stream = sys.stderr
        if stream is None or not getattr(stream, "isatty", lambda: False)():
            return None
        try:
            from tqdm.auto import tqdm  # type: ignore[import]
        except ImportError:
            return TextBar(label, stream)
        return _TqdmBar(label, tqdm)
    return progress  # type: ignore[no-any-return]


def close(callback: Optional[Callback]) -> None:
    """Erases a bar that reporter() made; a caller's callable is left alone."""
    if isinstance(callback, (TextBar, _TqdmBar)):
        callback.close()
