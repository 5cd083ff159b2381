"""What KvikIO has and ferry does not: each raises NotImplementedError naming it, never a silent
no-op. The error is also an AttributeError, so ``hasattr`` and ``getattr(..., default)`` answer
"absent" as for any missing name."""

from __future__ import annotations

from typing import Any, Callable, NoReturn


class NotInFerry(NotImplementedError, AttributeError):
    """A KvikIO feature that ferry.kvikio does not implement."""


def fail(name: str, why: str) -> NoReturn:
    raise NotInFerry(f"{name}: ferry.kvikio does not implement it ({why})")


def module_getattr(module: str, why: str) -> Callable[[str], Any]:
    """A module ``__getattr__``: every public name of KvikIO's `module` fails, saying why."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        fail(f"{module}.{name}", why)

    return __getattr__
