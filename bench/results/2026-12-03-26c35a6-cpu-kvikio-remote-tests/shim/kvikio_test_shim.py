"""Test-harness shim (outside ferry): gives kvikio.utils (ferry.kvikio.utils) KvikIO's own
LocalHttpServer test helper, loaded from the KvikIO snapshot's utils.py."""
import importlib.util
import kvikio.utils

_spec = importlib.util.spec_from_file_location(
    "_kvikio_upstream_utils", "/tmp/kvikio-tests/python/kvikio/kvikio/utils.py")
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
if not hasattr(kvikio.utils, "LocalHttpServer"):
    kvikio.utils.LocalHttpServer = _mod.LocalHttpServer

# KvikIO's tests/utils.py imports cupy at module level; test_s3_io.py uses only its
# localhost() and find_free_port(). Without cupy, give it those two.
import sys, types, socket
try:
    import cupy  # noqa: F401
except ImportError:
    _u = types.ModuleType("utils")
    _u.localhost = lambda: "127.0.0.1"

    def _find_free_port(host="127.0.0.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return s.getsockname()[1]

    _u.find_free_port = _find_free_port
    sys.modules["utils"] = _u
