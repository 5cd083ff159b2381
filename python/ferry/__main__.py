"""``python -m ferry ARGS``: runs the ferry command-line tool with ARGS. The tool is, in order:
$FERRY_CLI, the one built next to this extension, or `ferry` on PATH.
``python -m ferry --version`` prints the package's version without the tool."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Optional

from . import _ferry


def find_cli() -> Optional[str]:
    """The CLI to run: $FERRY_CLI, the tool built with this extension, or `ferry` on PATH."""
    env = os.environ.get("FERRY_CLI")
    if env:
        return env
    built = _ferry.cli_path
    if built and os.access(built, os.X_OK):
        return built
    return shutil.which("ferry")


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        print(f"ferry {_ferry.__version__} (Python package at {os.path.dirname(__file__)})")
        return
    cli = find_cli()
    if cli is None:
        sys.exit("python -m ferry: the ferry tool was not found: set FERRY_CLI, build with "
                 "-DFERRY_BUILD_TOOLS=ON, or put `ferry` on PATH")
    if not (os.path.isfile(cli) and os.access(cli, os.X_OK)):
        sys.exit(f"python -m ferry: {cli} (from FERRY_CLI) is not an executable file; point "
                 "FERRY_CLI at the ferry tool, or unset it")
    sys.stdout.flush()
    os.execv(cli, [cli, *sys.argv[1:]])


if __name__ == "__main__":
    main()
