"""``ferry.settings``: read and change ferry's process-wide settings.

    ferry.settings.task_size                 # 4194304
    ferry.settings.task_size = "1MiB"        # parsed by the C++ side, same errors
    with ferry.settings(compat="on", task_size="1MiB"):
        ...                                  # restored on exit

A scope changes the settings of the thread that enters it (not other threads'); scopes of one
thread nest, and leaving one removes exactly its own changes. ``ferry.settings`` is also a
mapping: ``ferry.settings["task_size"]``, ``dict(ferry.settings)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

from . import _ferry

# Short names accepted wherever a setting is named. `threads` means what the CLI's --threads
# means: ferry's worker threads for GPU and host memory alike (nthreads and host_nthreads).
ALIASES = {"compat": "compat_mode", "threads": "nthreads"}
BOTH_THREADS = ("nthreads", "host_nthreads")


def as_text(values: Mapping[str, Any]) -> dict[str, str]:
    """{name: value} with aliases resolved and values as the strings the C++ parser reads."""
    out = {}
    for name, value in values.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, str)):
            text = str(value)
        else:
            raise TypeError(f"ferry setting '{name}': expected str or int, got {type(value).__name__}")
        if name == "threads":
            out.update({both: text for both in BOTH_THREADS})
        else:
            out[ALIASES.get(name, name)] = text
    return out


class Scope:
    """Context manager returned by ``ferry.settings(**values)``; values are checked at once.
    Entering it changes this thread's settings; leaving it removes those changes."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._scope = _ferry.SettingsScope(as_text(values))

    def __enter__(self) -> "Scope":
        self._scope.enter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._scope.exit()


class Settings(Mapping[str, Any]):
    """ferry's settings as this thread sees them: each one is an attribute and a key (see
    ``names()``). Assigning one changes it process-wide; ``ferry.settings(**values)`` is a scope
    for this thread only."""

    def __call__(self, **values: Any) -> Scope:
        return Scope(values)

    def __getitem__(self, name: str) -> Any:
        return self._get(name, KeyError, repr(name))

    def __getattr__(self, name: str) -> Any:
        return self._get(name, AttributeError, f"'{name}'")

    def _get(self, name: str, error: type, shown: str) -> Any:
        current = _ferry.get_settings()
        try:
            return current[ALIASES.get(name, name)]
        except KeyError:
            raise error(f"ferry has no setting {shown}; known: {', '.join(current)}") from None

    def __setitem__(self, name: str, value: Any) -> None:
        _ferry.set_settings(as_text({name: value}))

    __setattr__ = __setitem__

    def __len__(self) -> int:
        return len(_ferry.get_settings())

    def update(self, **values: Any) -> None:
        """Changes several settings at once (all or none: they are parsed first)."""
        _ferry.set_settings(as_text(values))

    def names(self) -> list[str]:
        """The settings' names, as in C++."""
        return list(_ferry.get_settings())

    def as_dict(self) -> dict[str, Any]:
        """All settings as {name: value} (the same as ``dict(ferry.settings)``)."""
        return dict(_ferry.get_settings())

    def describe(self) -> list[dict[str, str]]:
        """One row per setting: name, env (its FERRY_* variable), value and source; then the
        variables read from the environment only (``environment_only``: the remote policy, the
        published statistics, the libraries ferry loads), which have no attribute here."""
        return list(_ferry.describe_settings())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __dir__(self) -> list[str]:
        return [*super().__dir__(), *self.names()]

    def __repr__(self) -> str:
        rows = [f"  {r['name']:<20} {r['value']:<12} ({r['source']}, {r['env']})" for r in self.describe()]
        return "ferry.settings:\n" + "\n".join(rows)


settings = Settings()
