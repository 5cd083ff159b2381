"""``ferry.Future``: an asynchronous request as a real :class:`concurrent.futures.Future`, so
that ``concurrent.futures.wait``/``as_completed``, ``add_done_callback`` and ``await`` work.

The C++ request (``_ferry.Request``) owns the buffer until it ends. A single watcher thread
waits for the requests in flight, with the GIL released, and settles each Future when its
request ends (and lets go of its buffer then); ``done()`` settles it at once when it sees the
request over.

``off_loop`` runs the submission of a request in a thread of ferry's own, so that asyncio code
(``File.aread``/``awrite``) never waits in the event loop's thread, even for the small requests
that ferry runs in the caller's thread."""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Generator, Optional, Union

from . import _ferry

_FINISHED = concurrent.futures._base.FINISHED

if TYPE_CHECKING:
    import asyncio


class Future(concurrent.futures.Future):  # type: ignore[type-arg]
    """An asynchronous read or write (``File.pread``/``File.pwrite``); its result is the bytes
    moved. Also a :class:`concurrent.futures.Future`: ``wait``, ``as_completed``,
    ``add_done_callback`` work, and it can be awaited in asyncio without blocking the loop.
    Waiting in ``result()`` or ``exception()`` is interruptible: Ctrl-C cancels the request."""

    # The state that a finished Future's result() reads lives in slots, which C reads and writes
    # at their offsets (_ferry.add_future_methods, bind_file.cc's future_of and future_result:
    # generic attribute access there cost 300 instructions an attribute, bench/NOTES.md §48).
    # concurrent.futures.Future's own code reaches them by name, through the slots' descriptors.
    __slots__ = ("_state", "_result", "_exception", "_ended", "_waiter_list")

    # A Future born finished reads these class defaults; __init__ below sets its own otherwise.
    _request: Optional[_ferry.Request] = None
    _done_callbacks: Any = ()  # a finished Future runs a callback at once and keeps none
    _once = threading.Lock()  # shared by Futures born finished, which never settle again
    _settled = True

    def __init__(self, request: Union[_ferry.Request, tuple[int, Any]]) -> None:
        if request.__class__ is tuple:
            # Ended well in the submitting thread (a small local request): (bytes moved, the
            # handle its Request is made from if asked for). Finished as set_result() leaves a
            # Future, without a Request, the watcher or the Condition (made if someone waits or
            # adds a callback): bench/NOTES.md §30. _ferry's future_of (bind_file.cc) makes
            # ferry.File.pread's the same way, in C: keep the two alike.
            self._result, self._ended = request
            self._state = _FINISHED
            self._exception = None
            return
        super().__init__()
        self._request = request
        self._once = threading.Lock()
        self._settled = False
        if request.done():
            self._settle()
        else:
            _watcher.watch(self)

    def _req(self) -> _ferry.Request:
        """The C++ request; made on first use for a Future born finished."""
        if self._request is None:
            self._request = _ferry.request_of(self._ended)
        return self._request

    @property
    def _waiters(self) -> list[Any]:
        """concurrent.futures.Future's waiters (wait() and as_completed() add and remove their
        own), made on first use: a Future born finished has none unless someone waits on it.
        concurrent.futures touches it only under _condition, so two threads never both make
        it."""
        try:
            return self._waiter_list
        except AttributeError:
            self._waiter_list: list[Any] = []
            return self._waiter_list

    @_waiters.setter
    def _waiters(self, waiters: list[Any]) -> None:
        self._waiter_list = waiters

    @property
    def _condition(self) -> threading.Condition:  # type: ignore[override]
        """concurrent.futures.Future's lock, made on first use: a Future finished at birth
        needs it only if someone waits on it or adds a callback."""
        cv = self.__dict__.get("_cv")
        if cv is None:
            cv = self.__dict__.setdefault("_cv", threading.Condition())
        return cv

    @_condition.setter
    def _condition(self, cv: threading.Condition) -> None:
        self.__dict__["_cv"] = cv

    def _settle(self) -> None:
        """Moves the ended request's outcome into the Future (once)."""
        with self._once:
            if self._settled:
                return
            self._settled = True
        try:
            n = self._request.result()
        except BaseException as e:  # the request's error, for exception()/result()
            self.set_exception(self._error(e))
        else:
            self.set_result(n)
        finally:
            self._request.release()

    def _error(self, e: BaseException) -> BaseException:
        """The exception this Future holds for the request's error `e` (a subclass may
        translate it, as ``ferry.kvikio.IOFuture`` does)."""
        return e

    def _wait(self, timeout: Optional[float]) -> None:
        if not self._request.wait(timeout):
            raise TimeoutError(f"ferry: the {self._request.op} is still running after {timeout} s")
        self._settle()

    def result(self, timeout: Optional[float] = None) -> int:
        """Waits (``TimeoutError`` after `timeout` s) and returns the bytes moved, or raises the
        request's error. Ctrl-C cancels the request and raises KeyboardInterrupt with
        ``bytes_done`` (bytes in place)."""
        if self._state == _FINISHED:  # final: read without the lock
            if self._exception is None:
                return int(self._result)
        elif not super().done():
            self._wait(timeout)
        return int(super().result())

    # ferry.File.pread/pwrite's module replaces result with a C method
    # (_ferry.add_future_methods) that returns a finished Future's bytes itself and calls this
    # one, under its own name in errors, for everything else.
    _result_slow = result

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """Waits like ``result()``; the request's error, or None."""
        if self._state == _FINISHED:
            return self._exception
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

    def done(self) -> bool:
        """True once the request has ended (or was cancelled); never waits."""
        if self._state == _FINISHED:
            return True
        if not super().done() and self._request.done():
            self._settle()
        return super().done()

    def running(self) -> bool:
        return not self.done()

    def progress(self) -> int:
        """Bytes moved so far by finished tasks."""
        return int(self._req().progress())

    @property
    def nbytes(self) -> int:
        """Bytes asked for."""
        return int(self._req().nbytes)

    @property
    def last_route(self) -> _ferry.RouteReport:
        """The route report of this request (waits for it to end)."""
        return self._req().last_route

    def __await__(self) -> Generator[Any, None, int]:
        import asyncio  # here, not at the top: it costs 10 ms of every `import ferry`

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
        return f"<ferry.Future {self._req().op} of {self.nbytes} bytes: {state}>"


class _Watcher:
    """One daemon thread that settles Futures when their requests end. It is stopped at exit,
    before the interpreter finalises: a daemon thread that comes back from a C++ wait (with the
    GIL released) while the interpreter finalises is ended inside a C++ destructor, which aborts
    the process ("terminate called without an active exception", 1 exit in 10 before)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._futures: list[Future] = []
        self._thread: Optional[threading.Thread] = None
        self._stopping = False

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
                while not self._futures and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
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

    def stop(self) -> None:
        """Ends the thread (at exit): within one wait slice, 20 ms. Futures still watched are
        not settled after this; their requests end with the process."""
        with self._cv:
            self._stopping = True
            thread = self._thread
            self._cv.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)


_watcher = _Watcher()
os.register_at_fork(after_in_child=_watcher._after_fork)
atexit.register(_watcher.stop)


class _OffLoop:
    """The threads that submit requests for asyncio callers. A submission is short (a large
    request only starts its tasks), except a small request that ferry runs in the submitting
    thread: that one waits for its I/O here, not in the event loop's thread. Several threads, so
    that one slow small read does not hold up the others."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None

    def executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ferry-aio")
            return self._pool

    def _after_fork(self) -> None:
        self.__init__()  # type: ignore[misc]


_off_loop = _OffLoop()
os.register_at_fork(after_in_child=_off_loop._after_fork)


def _in_settings(settings: dict[str, Any], call: Callable[[], "Future"]) -> "Future":
    """Runs `call` under the calling thread's settings as `settings` gave them: a scope of the
    loop's thread (``with ferry.settings(...)``) applies to the requests it starts off the loop."""
    here = _ferry.get_settings()
    changed = {k: v for k, v in settings.items() if here.get(k) != v}
    if not changed:
        return call()
    from ._settings import as_text

    scope = _ferry.SettingsScope(as_text(changed))
    scope.enter()
    try:
        return call()
    finally:
        scope.exit()


def _cancel_started(started: "concurrent.futures.Future[Future]") -> None:
    """Cancels the request that `started` submits, once submitted; waits for its tasks in
    flight (``Future.cancel``)."""
    try:
        future = started.result()
    except BaseException:  # the submission failed: nothing runs
        return
    future.cancel()


def _retrieved(f: "asyncio.Future[Any]") -> None:
    """Marks an abandoned asyncio future's outcome as seen (no 'never retrieved' log)."""
    if not f.cancelled():
        f.exception()


async def off_loop(submit: Callable[[], "Future"]) -> int:
    """Awaits the request that `submit()` starts, without ever waiting in the event loop's
    thread: `submit` runs in one of ferry's threads, under the caller's settings, and the
    request's end wakes the loop. Cancelling the awaiting task cancels the request and waits,
    off the loop, for its tasks in flight, so the buffer is not written after the
    ``CancelledError``."""
    import asyncio  # only code that already runs an event loop gets here

    loop = asyncio.get_running_loop()
    settings = _ferry.get_settings()
    pool = _off_loop.executor()
    started = pool.submit(_in_settings, settings, submit)
    waits: list["asyncio.Future[Any]"] = []
    try:
        waits.append(asyncio.wrap_future(started))
        future = await asyncio.shield(waits[-1])
        waits.append(asyncio.wrap_future(future))
        return int(await asyncio.shield(waits[-1]))
    except asyncio.CancelledError:
        for w in waits:
            w.add_done_callback(_retrieved)
        await asyncio.shield(loop.run_in_executor(pool, _cancel_started, started))
        raise
