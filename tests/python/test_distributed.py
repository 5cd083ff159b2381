"""ferry.distributed.load_checkpoint's whole flow, without a GPU: N ranks as threads of this
process over an in-process communicator (NumPy arrays; no torch needed), and N ranks as
processes over torch.distributed's gloo backend with CPU tensors (skipped, saying why, without
torch). Every rank's tensors must equal the full ones (or, sharded, their slices), the bytes read
from storage must add up to the checkpoint once, and one rank's failure (a missing file, a bad
header, an allocation that fails) must be an error on every rank, the group still usable after.
Checkpoints come from this test's own writer."""

from __future__ import annotations

import json
import os
import pickle
import socket
import struct
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import ferry
import ferry.distributed as fd
from ferry.distributed import Comm, DistributedLoadError
from test_checkpoint import encode

ITEM = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U8": 1, "BOOL": 1}
NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64, "U8": np.uint8,
      "BOOL": np.bool_}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --------------------------------------------------------------------------------- checkpoints


def make_tensors(seed, big=False):
    rng = np.random.default_rng(seed)
    shapes = [("embed", "BF16", (97, 24)), ("a.w", "F32", (40, 33)), ("a.b", "F32", (33,)),
              ("b.w", "F16", (5, 64, 3)), ("b.norm", "F32", (64,)), ("step", "I64", ()),
              ("mask", "BOOL", (7, 9)), ("empty", "F16", (0, 4)), ("c.w", "BF16", (1, 50, 6)),
              ("head", "F32", (61, 17)), ("bytes", "U8", (1001,))]
    if big:
        shapes.append(("big", "F32", (600, 1000)))  # 2.4 MB: split across ranks
    out = []
    for name, dtype, shape in shapes:
        n = int(np.prod(shape, dtype=np.int64)) * ITEM[dtype]
        data = rng.integers(0, 256, n, dtype=np.uint8)
        if dtype == "BOOL":
            data &= 1
        out.append((name, dtype, shape, data.tobytes()))
    return out


def write_single(tmp_path, seed=0, big=True):
    tensors = make_tensors(seed, big)
    path = tmp_path / "model.safetensors"
    path.write_bytes(encode(tensors))
    return str(path), tensors


def write_sharded(tmp_path, seed=1):
    """A directory of three shards and an index."""
    tensors = make_tensors(seed, big=True)
    parts = [tensors[:4], tensors[4:9], tensors[9:]]
    d = tmp_path / "sharded"
    d.mkdir()
    weight_map = {}
    for k, part in enumerate(parts):
        name = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
        (d / name).write_bytes(encode(part))
        weight_map.update({t[0]: name for t in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {},
                                                                "weight_map": weight_map}))
    return str(d), tensors


PLAN = {"embed": 0, "a.w": 1, "b.w": 1, "c.w": 2, "head": -1, "mask": 0}  # half the tensors


def expected(tensors, world, rank, plan=None):
    """{name: (shape, bytes)} that `rank` of `world` must end with."""
    out = {}
    dims = {}
    for name, dim in (plan or {}).items():
        dims[name] = dim
    for name, dtype, shape, data in tensors:
        if name not in dims:
            out[name] = (tuple(shape), data)
            continue
        d = dims[name] % len(shape)
        items = np.frombuffer(data, np.uint8).reshape(tuple(shape) + (ITEM[dtype],))
        part = np.array_split(items, world, axis=d)[rank]
        out[name] = (part.shape[:-1], np.ascontiguousarray(part).tobytes())
    return out


def as_bytes(array):
    a = np.ascontiguousarray(array)
    return a.reshape(-1).view(np.uint8).tobytes()


# --------------------------------------------------------------------------------- threads


class _Hub:
    def __init__(self, size):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=60)
        self.slots = [None] * size


class ThreadComm(Comm):
    """Ranks as threads of one process: what an engine does, with NumPy arrays."""

    backend = "threads"

    def __init__(self, hub, rank):
        self.hub, self.rank, self.size = hub, rank, hub.size
        self.ops = []

    def _swap(self, value):
        self.hub.slots[self.rank] = value
        self.hub.barrier.wait()
        seen = list(self.hub.slots)
        self.hub.barrier.wait()
        return seen

    def allgather_object(self, obj):
        return [pickle.loads(pickle.dumps(x)) for x in self._swap(obj)]

    def broadcast(self, buf, src):
        self.ops.append(("broadcast", src, buf.size))
        seen = self._swap(buf if self.rank == src else None)
        if self.rank != src:
            buf[...] = seen[src]
        self.hub.barrier.wait()

    def scatter(self, out, chunks, src):
        self.ops.append(("scatter", src, out.size))
        seen = self._swap(chunks if self.rank == src else None)
        assert all(c.size == out.size for c in seen[src])
        out[...] = seen[src][self.rank]
        self.hub.barrier.wait()


def run_ranks(world, body):
    """body(comm) on `world` threads; returns [(result, exception, comm)] by rank."""
    hub = _Hub(world)
    comms = [ThreadComm(hub, r) for r in range(world)]
    results = [None] * world

    def one(r):
        try:
            results[r] = (body(comms[r]), None, comms[r])
        except BaseException as e:  # every rank's outcome is checked
            results[r] = (None, e, comms[r])
            hub.barrier.abort() if not isinstance(e, DistributedLoadError) else None

    threads = [threading.Thread(target=one, args=(r,), name=f"rank{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


def check_rank(tensors_out, tensors, world, rank, plan=None):
    want = expected(tensors, world, rank, plan)
    assert set(tensors_out) == set(want)
    for name, (shape, data) in want.items():
        got = tensors_out[name]
        assert tuple(got.shape) == tuple(shape), name
        assert as_bytes(got) == data, name


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_threads_replicated_every_rank_gets_every_tensor(tmp_path, world, layout):
    path, tensors = (write_single if layout == "single" else write_sharded)(tmp_path)
    total = sum(len(t[3]) for t in tensors)
    out = run_ranks(world, lambda c: (fd.load_checkpoint(path, group=c, device="cpu"),
                                      fd.last_load_report()))
    for r, (res, err, comm) in enumerate(out):
        assert err is None, err
        tensors_out, _ = res
        check_rank(tensors_out, tensors, world, r)
        assert tensors_out["embed"].dtype == np.uint16  # BF16 in NumPy: its bits
    report = out[0][0][1]
    assert report.world == world and report.checkpoint_bytes == total
    assert report.bytes_read == total  # each byte from storage once, not `world` times
    assert sum(rk.bytes_read for rk in report.ranks) == total
    assert report.exchange_payload_bytes == total
    assert report.exchange_delivered_bytes == total * (world - 1)
    assert sum(rk.bytes_received for rk in report.ranks) == total * (world - 1)
    assert all(rk.routes for rk in report.ranks if rk.bytes_read)
    assert "from storage: %d B in all (1.000x" % total in report.summary()
    json.loads(report.to_json())


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("one_allocation", [False, True])
def test_threads_sharded_slices_equal_the_full_tensors(tmp_path, world, one_allocation):
    path, tensors = write_sharded(tmp_path)
    total = sum(len(t[3]) for t in tensors)
    out = run_ranks(world, lambda c: (fd.load_checkpoint(path, group=c, device="cpu", plan=PLAN,
                                                         one_allocation=one_allocation,
                                                         bucket_size=4096),
                                      fd.last_load_report()))
    for r, (res, err, comm) in enumerate(out):
        assert err is None, err
        check_rank(res[0], tensors, world, r, PLAN)
    report = out[0][0][1]
    assert report.bytes_read == total and report.sharded == len(PLAN)
    assert report.scatters == 4  # a.w, b.w, c.w (its dim 2 follows a 50), head; not embed/mask


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")  # random bits: NaNs
def test_threads_callable_plan_and_dtype(tmp_path):
    path, tensors = write_single(tmp_path)
    plan = lambda name, shape: 0 if len(shape) == 2 else None  # noqa: E731
    out = run_ranks(2, lambda c: fd.load_checkpoint(path, group=c, device="cpu", plan=plan,
                                                    dtype=np.float64))
    names2d = {t[0]: 0 for t in tensors if len(t[2]) == 2}
    for r, (res, err, _) in enumerate(out):
        assert err is None, err
        assert res["a.w"].dtype == np.float64 and res["bytes"].dtype == np.uint8
        want = expected(tensors, 2, r, names2d)
        assert res["a.w"].shape == want["a.w"][0]
        full = np.frombuffer(want["a.w"][1], np.float32).reshape(want["a.w"][0])
        assert np.array_equal(res["a.w"], full.astype(np.float64), equal_nan=True)


def test_threads_a_missing_file_on_one_rank_fails_every_rank(tmp_path):
    path, _ = write_single(tmp_path)
    out = run_ranks(3, lambda c: fd.load_checkpoint(path if c.rank != 1 else path + ".missing",
                                                    group=c, device="cpu"))
    for res, err, _ in out:
        assert isinstance(err, DistributedLoadError), err
        assert err.phase == "open" and list(err.failures) == [1]
        assert "rank(s) 1 of 3" in str(err) and "no such file" in str(err).lower()
    assert isinstance(out[1][1].__cause__, ferry.CheckpointError)  # the rank's own error
    assert out[0][1].__cause__ is None


def test_threads_a_bad_header_or_another_checkpoint_fails_every_rank(tmp_path):
    path, _ = write_single(tmp_path)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 9) + b"{not json")
    out = run_ranks(2, lambda c: fd.load_checkpoint(path if c.rank == 0 else str(bad), group=c,
                                                    device="cpu"))
    for _, err, _ in out:
        assert isinstance(err, DistributedLoadError) and err.failures.keys() == {1}
        assert "CheckpointError" in str(err)
    (tmp_path / "other").mkdir()
    other, _ = write_single(tmp_path / "other", seed=5, big=False)
    out = run_ranks(2, lambda c: fd.load_checkpoint(path if c.rank == 0 else other, group=c,
                                                    device="cpu"))
    for _, err, _ in out:
        assert isinstance(err, DistributedLoadError) and "do not see the same" in str(err)


def test_threads_a_failed_allocation_on_one_rank_fails_every_rank(tmp_path, monkeypatch):
    from ferry.checkpoint import _Numpy
    path, tensors = write_single(tmp_path)
    real = _Numpy.raw

    def raw(self, nbytes):
        if threading.current_thread().name == "rank2" and nbytes > (1 << 20):
            raise MemoryError("simulated out of memory")
        return real(self, nbytes)

    monkeypatch.setattr(_Numpy, "raw", raw)
    out = run_ranks(3, lambda c: fd.load_checkpoint(path, group=c, device="cpu"))
    for _, err, _ in out:
        assert isinstance(err, DistributedLoadError) and err.phase == "read"
        assert err.failures.keys() == {2} and "simulated out of memory" in str(err)
    monkeypatch.setattr(_Numpy, "raw", real)
    # The group is still usable: nothing was left half-way inside a collective.
    out = run_ranks(3, lambda c: fd.load_checkpoint(path, group=c, device="cpu"))
    for r, (res, err, _) in enumerate(out):
        assert err is None
        check_rank(res, tensors, 3, r)


def test_threads_plan_error_is_the_same_on_every_rank(tmp_path):
    path, _ = write_single(tmp_path)
    out = run_ranks(2, lambda c: fd.load_checkpoint(path, group=c, device="cpu",
                                                    plan={"nope": 0}))
    for _, err, _ in out:
        assert isinstance(err, DistributedLoadError) and err.failures.keys() == {0, 1}
        assert "lacks: 'nope'" in str(err)


class FakeMpi:
    """mpi4py's communicator methods that MpiComm calls, over the threads' hub: checks the
    adapter (uppercase buffer calls, Scatter of one concatenated buffer), not MPI itself."""

    def __init__(self, comm):
        self.c = comm

    def Get_rank(self):
        return self.c.rank

    def Get_size(self):
        return self.c.size

    def allgather(self, obj):
        return self.c.allgather_object(obj)

    def Bcast(self, buf, root):
        self.c.broadcast(buf, root)

    def Scatter(self, send, out, root):
        n = out.size
        self.c.scatter(out, None if send is None else [send[r * n:(r + 1) * n]
                                                       for r in range(self.c.size)], root)


@pytest.mark.parametrize("world", [1, 3])
def test_mpi_adapter_over_threads(tmp_path, world):
    path, tensors = write_sharded(tmp_path)
    out = run_ranks(world, lambda c: (fd.load_checkpoint(path, group=fd.MpiComm(FakeMpi(c)),
                                                         plan=PLAN), fd.last_load_report()))
    for r, (res, err, _) in enumerate(out):
        assert err is None, err
        check_rank(res[0], tensors, world, r, PLAN)
        assert res[1].engine == f"MPI (mpi4py), {world} rank(s)"


def test_without_an_initialized_group_it_says_so(tmp_path):
    pytest.importorskip("torch")
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialized in this process")
    path, _ = write_single(tmp_path)
    with pytest.raises(RuntimeError, match="init_process_group"):
        fd.load_checkpoint(path)


# --------------------------------------------------------------------------------- gloo


WORKER = r'''
import datetime, os, pickle, sys, traceback
import torch, torch.distributed as dist
import ferry.distributed as fd
from ferry.checkpoint import _Torch

out_dir, single, sharded, plan = sys.argv[1], sys.argv[2], sys.argv[3], eval(sys.argv[4])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
results = {}

def record(key, tensors):
    results[key] = {"tensors": {n: (tuple(t.shape), str(t.dtype),
                                    bytes(t.reshape(-1).view(torch.uint8).numpy()))
                                for n, t in tensors.items()},
                    "report": fd.last_load_report().to_dict()}

def failure(key, fn):
    try:
        fn()
        results[key] = {"error": None}
    except fd.DistributedLoadError as e:
        results[key] = {"error": str(e), "phase": e.phase, "failures": sorted(e.failures),
                        "cause": type(e.__cause__).__name__}

record("replicated", fd.load_checkpoint(single))
record("replicated_sharded_dir", fd.load_checkpoint(sharded, device="cpu"))
record("one_allocation", fd.load_checkpoint(single, one_allocation=True))
record("small_buckets", fd.load_checkpoint(sharded, bucket_size=4096))
record("plan", fd.load_checkpoint(sharded, plan=plan))
record("plan_one_allocation", fd.load_checkpoint(single, plan=plan, one_allocation=True))
failure("missing", lambda: fd.load_checkpoint(single + (".missing" if rank == world - 1 else "")))
real = _Torch.raw
def raw(self, nbytes):
    if rank == 0 and nbytes > (1 << 20):
        raise RuntimeError("CUDA out of memory (simulated)")
    return real(self, nbytes)
_Torch.raw = raw
failure("oom", lambda: fd.load_checkpoint(single))
_Torch.raw = real
record("after_failures", fd.load_checkpoint(single))
if world == 3:  # a group of ranks 1 and 2 only: its ranks 0 and 1 are the world's 1 and 2
    sub = dist.new_group([1, 2])
    if rank in (1, 2):
        record("subgroup", fd.load_checkpoint(sharded, group=sub, plan=plan))
with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
    pickle.dump(results, f)
dist.destroy_process_group()
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(tmp_path, world, args, timeout=240, worker=WORKER):
    """`world` processes of `worker` as torchrun would start them (env://, localhost only), each
    given tmp_path and `args`; returns what each rank pickled to tmp_path/rank{r}.pkl."""
    script = tmp_path / "worker.py"
    script.write_text(worker)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(REPO, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **fd.MULTICAST_OFF)
    procs = []
    for r in range(world):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world))
        procs.append(subprocess.Popen([sys.executable, str(script), str(tmp_path)] + args, env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, text) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{text[-4000:]}"
    return [pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_gloo_ranks_load_replicated_and_sharded_and_fail_together(tmp_path, world):
    torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip(f"torch {torch.__version__} has no gloo backend")
    single, t_single = write_single(tmp_path)
    sharded, t_sharded = write_sharded(tmp_path)
    results = launch(tmp_path, world, [single, sharded, repr(PLAN)])
    source = {"replicated": (t_single, None), "replicated_sharded_dir": (t_sharded, None),
              "one_allocation": (t_single, None), "small_buckets": (t_sharded, None),
              "plan": (t_sharded, PLAN), "plan_one_allocation": (t_single, PLAN),
              "after_failures": (t_single, None)}
    for key, (tensors, plan) in source.items():
        total = sum(len(t[3]) for t in tensors)
        for r in range(world):
            got = results[r][key]["tensors"]
            want = expected(tensors, world, r, plan)
            assert set(got) == set(want), key
            for name, (shape, data) in want.items():
                assert got[name][0] == tuple(shape), (key, r, name)
                assert got[name][2] == data, (key, r, name)
            assert got["embed"][1] == "torch.bfloat16"
            report = results[r][key]["report"]
            assert report["bytes_read"] == total == report["checkpoint_bytes"], key
            assert sum(rk["bytes_read"] for rk in report["ranks"]) == total
            assert report["engine"] == f"torch.distributed gloo, {world} rank(s)"
    if world == 3:
        assert "subgroup" not in results[0]
        for r in (1, 2):
            got = results[r]["subgroup"]["tensors"]
            want = expected(t_sharded, 2, r - 1, PLAN)
            assert {n: g[0] for n, g in got.items()} == {n: tuple(w[0]) for n, w in want.items()}
            assert all(got[n][2] == w[1] for n, w in want.items())
            assert results[r]["subgroup"]["report"]["world"] == 2
    for r in range(world):
        missing = results[r]["missing"]
        assert missing["phase"] == "open" and missing["failures"] == [world - 1], missing
        assert "no such file" in missing["error"].lower()
        oom = results[r]["oom"]
        assert oom["phase"] == "read" and oom["failures"] == [0], oom
        assert "CUDA out of memory (simulated)" in oom["error"]
    assert results[world - 1]["missing"]["cause"] == "CheckpointError"


# --------------------------------------------------------------------------------- one process


def test_parse_devices():
    assert fd.parse_devices("0,1") == [0, 1]
    assert fd.parse_devices(" 1 , 0 ") == [1, 0]
    assert fd.parse_devices(["cuda:2", 0]) == [2, 0]
    assert fd.parse_devices(3) == [3]
    for bad in ("0,0", "x", "", "-1", ["cuda"], "0,,1"):
        with pytest.raises(ValueError):
            fd.parse_devices(bad)


def test_several_gpus_without_a_gpu_say_so(tmp_path):
    if fd.gpu_count() > 0:
        pytest.skip("a GPU is here: tests/python/test_distributed_gpu.py covers it")
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 100)
    with pytest.raises(ferry.CudaError, match="no GPU|CUDA driver"):
        fd.parse_devices("all")
    with pytest.raises(ferry.CudaError):
        fd.read_split(str(path), [0, 1])
    with pytest.raises(ferry.CudaError):
        fd.prepare_devices([0])
