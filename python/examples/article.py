"""The article's example with ferry: make a 1 GiB file, read it into a GPU array, print the route.

    PYTHONPATH=python python3 python/examples/article.py [/path/to/1GiB.bin]

Without a path it writes $TMPDIR/ferry-1GiB.bin (/tmp by default) and deletes it at the end; a
path given is kept (and made when missing). Uses CuPy when it sees a GPU, NumPy on the host otherwise. Run with FERRY_COMPAT_MODE=on or
CUFILE_FORCE_COMPAT_MODE=true to watch the route change.
"""

import os
import sys
import tempfile

import numpy as np

import ferry

GiB = 1 << 30


def main() -> None:
    keep = len(sys.argv) > 1
    path = sys.argv[1] if keep else os.path.join(tempfile.gettempdir(), "ferry-1GiB.bin")
    try:
        run(path)
    finally:
        if not keep and os.path.exists(path):
            os.remove(path)
            print(f"removed {path}")


def run(path: str) -> None:
    if not os.path.exists(path) or os.path.getsize(path) != GiB:
        with open(path, "wb") as f:
            for _ in range(GiB // (64 << 20)):
                f.write(os.urandom(64 << 20))

    try:
        import cupy

        array = cupy.empty(GiB, dtype=cupy.uint8) if cupy.cuda.runtime.getDeviceCount() else None
    except Exception:  # no CuPy, or no GPU
        array = None
    if array is None:
        print("no GPU through CuPy: reading into a NumPy array")
        array = np.empty(GiB, dtype=np.uint8)

    with ferry.open(path) as f:
        nbytes = f.read(array)
        route = f.last_route
    print(f"read {nbytes} bytes into {type(array).__module__}.{type(array).__name__} "
          f"in {route.seconds:.3f} s ({nbytes / GiB / max(route.seconds, 1e-9):.2f} GiB/s)")
    print(route)


if __name__ == "__main__":
    main()
