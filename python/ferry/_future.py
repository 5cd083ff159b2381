"""``ferry.Future``: an asynchronous request as a real :class:`concurrent.futures.Future`, so
that ``concurrent.futures.wait``/``as_completed``, ``add_done_callback`` and ``await`` work.

The C++ request (``_ferry.Request``) owns the buffer until it ends. A single watcher thread
waits for the requests in flight, with the GIL released, and settles each Future when its
request ends (and lets go of its buffer then)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Any, Generator, Optional

from . import _ferry


class Future(concurrent.futures.Future):  # type: ignore[type-arg]
    """An asynchronous read or write (``File.pread``/``File.pwrite``); its result is the bytes
    moved. Also a :class:`concurrent.futures.Future`: ``wait``, ``as_completed``,
    ``add_done_callback`` work, and it can be awaited in asyncio without blocking the loop.
    Waiting in ``result()`` or ``exception()`` is interruptible: Ctrl-C cancels the request."""

    def __init__(self, request: _ferry.Request) -> None:
        super().__init__()
        self._request = request
        self._once = threading.Lock()
        self._settled = False
        if request.done():
            self._settle()
        else:
            _watcher.watch(self)

    def _settle(self) -> None:
        """Moves the ended request's outcome into the Future (once)."""
        with self._once:
            if self._settled:
                return
            self._settled = True
        try:
            n = self._request.result()
        except BaseException as e:  # the request's error, for exception()/result()
            self.set_exception(e)
        else:
            self.set_result(n)
        finally:
            self._request.release()

    def _wait(self, timeout: Optional[float]) -> None:
        if not self._request.wait(timeout):
            raise TimeoutError(f"ferry: the {self._request.op} is still running after {timeout} s")
        self._settle()

    def result(self, timeout: Optional[float] = None) -> int:
        """Waits (``TimeoutError`` after `timeout` s) and returns the bytes moved, or raises the
        request's error. Ctrl-C cancels the request and raises KeyboardInterrupt with
        ``bytes_done`` (bytes in place)."""
        if not super().done():
            self._wait(timeout)
        return int(super().result())

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """Waits like ``result()``; the request's error, or None."""
        if not super().done():
            self._wait(timeout)
        return super().exception()

    def cancel(self) -> bool:
        """Stops the request: tasks not yet started do not start, tasks in flight finish (this
        waits for them, so the buffer is not written after it returns). False when the request
        had already ended; then the Future holds its result."""
        with self._once:
            if self._settled or not self._request.cancel():
                return False
            self._settled = True
        self._request.wait_quietly(1e9)
        self._request.release()
        return super().cancel()

    def running(self) -> bool:
        return not self.done()

    def progress(self) -> int:
        """Bytes moved so far by finished tasks."""
        return int(self._request.progress())

    @property
    def nbytes(self) -> int:
        """Bytes asked for."""
        return int(self._request.nbytes)

    @property
    def last_route(self) -> _ferry.RouteReport:
        """The route report of this request (waits for it to end)."""
        return self._request.last_route

    def __await__(self) -> Generator[Any, None, int]:
        return asyncio.wrap_future(self).__await__()

    def __repr__(self) -> str:
        if self.cancelled():
            state = "cancelled"
        elif not super().done():
            state = f"running, {self.progress()} bytes done"
        elif super().exception() is not None:
            state = f"failed: {super().exception()}"
        else:
            state = f"finished, {super().result()} bytes"
        return f"<ferry.Future {self._request.op} of {self.nbytes} bytes: {state}>"


class _Watcher:
    """One daemon thread that settles Futures when their requests end."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._futures: list[Future] = []
        self._thread: Optional[threading.Thread] = None

    def watch(self, future: Future) -> None:
        with self._cv:
            self._futures.append(future)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ferry-futures",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._futures:
                    self._cv.wait()
                first = self._futures[0]
            first._request.wait_quietly(0.02)
            with self._cv:
                ended: list[Future] = []
                running: list[Future] = []
                for f in self._futures:
                    (ended if f._request.done() else running).append(f)
                self._futures = running
            for f in ended:
                f._settle()

    def _after_fork(self) -> None:
        # The thread does not exist in a child; the parent's requests are not the child's.
        self.__init__()  # type: ignore[misc]


_watcher = _Watcher()
os.register_at_fork(after_in_child=_watcher._after_fork)

__all__ = ["Future"]
