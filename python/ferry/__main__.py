"""``python -m ferry ARGS``: runs the ferry command-line tool with ARGS. The tool is, in order:
$FERRY_CLI, the one built next to this extension, `ferry` in this interpreter's scripts folder
(where pip put it: a virtual environment's bin/, even one that was not activated), or `ferry` on
PATH. ``python -m ferry --version`` prints the package's version without the tool."""

from __future__ import annotations

import os
import shutil
import site
import sys
import sysconfig
from typing import List, Optional

from . import _ferry


def _scripts_dirs() -> List[str]:
    """Where pip installs this interpreter's commands: its scheme's scripts folder, the folder
    of the interpreter itself (a venv's bin/; sys.executable is not resolved, since a venv's
    python is a link to the base interpreter), and the user scheme's when the package was
    installed with --user."""
    dirs = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    user_site = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user_site and os.path.realpath(__file__).startswith(os.path.realpath(user_site) + os.sep):
        dirs.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    out: List[str] = []
    for d in dirs:
        if d and d not in out:
            out.append(d)
    return out


def find_cli() -> Optional[str]:
    """The CLI to run: $FERRY_CLI, the tool built with this extension, `ferry` in this
    interpreter's scripts folder, or `ferry` on PATH."""
    env = os.environ.get("FERRY_CLI")
    if env:
        return env
    built = _ferry.cli_path
    if built and os.access(built, os.X_OK):
        return built
    for d in _scripts_dirs():
        tool = os.path.join(d, "ferry")
        if os.path.isfile(tool) and os.access(tool, os.X_OK):
            return tool
    return shutil.which("ferry")


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        print(f"ferry {_ferry.__version__} (Python package at {os.path.dirname(__file__)})")
        return
    cli = find_cli()
    if cli is None:
        sys.exit("python -m ferry: the ferry tool was not found: not in FERRY_CLI, not built with "
                 f"this extension, not in {' or '.join(_scripts_dirs())}, not on PATH; "
                 "`pip install .` puts it beside the interpreter, or set FERRY_CLI")
    if not (os.path.isfile(cli) and os.access(cli, os.X_OK)):
        sys.exit(f"python -m ferry: {cli} (from FERRY_CLI) is not an executable file; point "
                 "FERRY_CLI at the ferry tool, or unset it")
    sys.stdout.flush()
    os.execv(cli, [cli, *sys.argv[1:]])


if __name__ == "__main__":
    main()
