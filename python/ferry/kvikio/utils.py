"""``kvikio.utils``: KvikIO's helpers for its own deprecations (``ferry.kvikio`` keeps KvikIO's
deprecated functions working, with the same ``FutureWarning``), ``call_once``, and
``LocalHttpServer`` (a directory served over HTTP for tests, imported when first used)."""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def kvikio_deprecation_notice(msg: str, *, since: str) -> Callable[[F], F]:
    """Decorator: calling the function warns ``FutureWarning(msg)``; its docstring says since
    which version it is deprecated (as KvikIO's decorator does)."""

    def decorator(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warnings.warn(msg, category=FutureWarning, stacklevel=2)
            return func(*args, **kwargs)

        wrapper.__doc__ = f"{func.__doc__ or ''}\n\n.. deprecated:: {since}\n   {msg}"
        return wrapper  # type: ignore[return-value]

    return decorator


def kvikio_deprecate_module(msg: str, *, since: str) -> None:
    """Warns ``FutureWarning`` that a module is deprecated since `since`."""
    warnings.warn(f"This module is deprecated since {since} and will be removed in an upcoming "
                  f"release. {msg}", category=FutureWarning, stacklevel=2)


def call_once(func: F) -> F:
    """Caches the result of the first call (KvikIO's ``call_once``)."""
    return functools.lru_cache(maxsize=None)(func)  # type: ignore[return-value]


def __getattr__(name: str) -> Any:
    # LocalHttpServer imports http.server and multiprocessing: not at every `import ferry.kvikio`.
    if name == "LocalHttpServer":
        from ._local_http_server import LocalHttpServer

        return LocalHttpServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
