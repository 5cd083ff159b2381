"""``python -m ferry ARGS``: runs the ferry command-line tool with ARGS. The tool is, in order:
$FERRY_CLI, the one built next to this extension, or `ferry` on PATH."""

from __future__ import annotations

import os
import shutil
import sys
from typing import Optional

from . import _ferry


def find_cli() -> Optional[str]:
    env = os.environ.get("FERRY_CLI")
    if env:
        return env
    built = _ferry.cli_path
    if built and os.access(built, os.X_OK):
        return built
    return shutil.which("ferry")


def main() -> None:
    cli = find_cli()
    if cli is None:
        sys.exit("python -m ferry: the ferry tool was not found: set FERRY_CLI, build with "
                 "-DFERRY_BUILD_TOOLS=ON, or put `ferry` on PATH")
    sys.stdout.flush()
    os.execv(cli, [cli, *sys.argv[1:]])


if __name__ == "__main__":
    main()
