"""ferry's Python GPU paths without a GPU, on the test double of libcuda (tests/fake_cuda):
device memory from the double through ctypes, handed to ferry with ``__cuda_array_interface__``,
in a child process whose FERRY_CUDA_LIBRARY names the double. scripts/test sets FERRY_FAKE_CUDA
to the double's path; elsewhere these tests skip."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

FAKE = os.environ.get("FERRY_FAKE_CUDA", "")
pytestmark = pytest.mark.skipif(not os.path.exists(FAKE),
                                reason="FERRY_FAKE_CUDA does not name the libcuda double "
                                       "(scripts/test sets it)")

CHILD = r'''
import ctypes, os, sys
import ferry
import ferry.kvikio as kvikio
from ferry import _streams

lib = ctypes.CDLL(os.environ["FERRY_CUDA_LIBRARY"])

def check(result, what):
    if result != 0:
        raise RuntimeError(f"{what}: CUDA error {result}")

check(lib.cuInit(0), "cuInit")
ctx = ctypes.c_void_p()
check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain")
check(lib.cuCtxSetCurrent(ctx), "set current")

class DeviceArray:
    """Device memory of the double, as CuPy would export it."""
    def __init__(self, n):
        p = ctypes.c_uint64()
        check(lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc")
        self.ptr, self.n = p.value, n
    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.n,), "typestr": "|u1", "data": (self.ptr, False), "version": 3}
    def host(self):
        out = (ctypes.c_char * self.n)()
        check(lib.cuMemcpyDtoH_v2(out, ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.n)), "DtoH")
        return bytes(out)

path = sys.argv[1]
data = open(path, "rb").read()
f = ferry.File(path)

a = DeviceArray(len(data))
assert f.read(a) == len(data)
assert a.host() == data, "read into device memory"
assert f.last_route.memory == "gpu", f.last_route

stream = ctypes.c_void_p()
check(lib.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
b = DeviceArray(len(data))
fut = f.read_async(b, stream=stream.value)
_streams.synchronize(stream.value)  # through the driver ferry loaded, not libcuda.so.1
assert fut.result() == len(data)
assert b.host() == data, "stream-ordered read"
assert "pinned staging" in fut.last_route.to_text(), fut.last_route.to_text()

with kvikio.CuFile(path, "r") as cf:
    c = DeviceArray(len(data))
    assert cf.read(c) == len(data)
    assert c.host() == data, "kvikio read"
    d = DeviceArray(len(data))
    assert cf.raw_read_async(d, stream.value).check_bytes_done() == len(data)
    assert d.host() == data, "kvikio raw_read_async"
    e = DeviceArray(len(data))
    assert cf.raw_read(e, size=100, file_offset=8, dev_offset=16) == 100
    assert e.host()[16:116] == data[8:108], "kvikio raw_read at a dev_offset"

out = path + ".out"
with ferry.File(out, "w") as w:
    assert w.write_async(a, stream=stream.value).result() == len(data)
_streams.synchronize(0)
assert open(out, "rb").read() == data, "stream-ordered write from device memory"
print("fake-gpu ok")
'''


def test_device_memory_paths_on_the_libcuda_double(data_file, tmp_path):
    path, _ = data_file
    env = dict(os.environ, FERRY_CUDA_LIBRARY=FAKE)
    local = tmp_path / "f.bin"
    local.write_bytes(open(path, "rb").read())
    r = subprocess.run([sys.executable, "-c", CHILD, str(local)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fake-gpu ok" in r.stdout


HOST_ONLY = r'''
import ctypes, json, os, struct, sys
import numpy as np
import ferry

lib = ctypes.CDLL(os.environ["FERRY_CUDA_LIBRARY"])

def initialised():
    n = ctypes.c_int()
    return lib.cuDeviceGetCount(ctypes.byref(n)) != 3  # CUDA_ERROR_NOT_INITIALIZED

path, ckpt = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
f = ferry.File(path)
buf = np.empty(len(data), np.uint8)
assert f.read(buf) == len(data) and buf.tobytes() == data
assert f.last_route.memory == "host", f.last_route
small = np.empty(100, np.uint8)
assert f.pread(small, 100, 7).result() == 100 and small.tobytes() == data[7:107]
t = ferry.load_checkpoint(ckpt, framework="np")
assert t["w"].tobytes() == data[:4096]
assert not initialised(), "a process that reads into host memory only initialised CUDA"

# The application initialises CUDA later (as torch does at its first CUDA call): device memory
# is then told from host memory again.
assert lib.cuInit(0) == 0
ctx = ctypes.c_void_p()
assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert lib.cuCtxSetCurrent(ctx) == 0
p = ctypes.c_uint64()
assert lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(len(data))) == 0
class Dev:
    __cuda_array_interface__ = {"shape": (len(data),), "typestr": "|u1", "data": (p.value, False),
                                "version": 3}
assert f.read(Dev()) == len(data)
assert f.last_route.memory == "gpu", f.last_route
out = (ctypes.c_char * len(data))()
assert lib.cuMemcpyDtoH_v2(out, ctypes.c_uint64(p.value), ctypes.c_size_t(len(data))) == 0
assert bytes(out) == data
assert f.read(buf) == len(data) and f.last_route.memory == "host"
print("host-only ok")
'''


def test_host_reads_never_initialise_cuda_and_device_memory_is_known_once_the_app_does(
        data_file, tmp_path):
    # cuInit takes 0.1 to 0.2 s on the GPU machine: a process that reads into host memory only
    # (a CPU checkpoint load) must not pay it, and pointers are still classified right once the
    # application initialises CUDA itself.
    path, data = data_file
    header = json.dumps({"w": {"dtype": "U8", "shape": [4096], "data_offsets": [0, 4096]}})
    header += " " * (-len(header) % 8)
    ckpt = tmp_path / "c.safetensors"
    ckpt.write_bytes(struct.pack("<Q", len(header)) + header.encode() + data[:4096])
    env = dict(os.environ, FERRY_CUDA_LIBRARY=FAKE)
    r = subprocess.run([sys.executable, "-c", HOST_ONLY, path, str(ckpt)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "host-only ok" in r.stdout
