"""ferry.iter_weights: every tensor, in file order, each owning its memory; read-ahead within the
memory budget (ferry's accounting, and tracemalloc's count of NumPy's allocations when the
consumer drops each tensor); names= reads only the named tensors' bytes; evict=True drops the
files' pages. Checkpoints come from this test's own writer; CPU only except the `gpu` test."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import tracemalloc

import pytest

import ferry

torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")

MiB = 1 << 20


def write(path, tensors):
    """A safetensors file of {name: torch tensor}, in that order; fsynced, so its pages can be
    dropped."""
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.bool: "BOOL", torch.uint8: "U8"}
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
        f.flush()
        os.fsync(f.fileno())
    return str(path)


def model(seed=0, n=12, rows=64, cols=1024):
    g = torch.Generator().manual_seed(seed)
    out = {f"layers.{i}.w": torch.randn(rows, cols, generator=g) for i in range(n)}
    out.update({"norm": torch.randn(cols, generator=g).to(torch.bfloat16),
                "step": torch.tensor(7), "mask": torch.rand(3, 5, generator=g) > 0.5,
                "empty": torch.zeros(0, 4, dtype=torch.float16)})
    return out


def sharded_dir(tmp_path, tensors, parts=3):
    """A folder of `parts` shards and model.safetensors.index.json."""
    d = tmp_path / "sharded"
    d.mkdir()
    names = list(tensors)
    weight_map = {}
    for k in range(parts):
        file = f"model-{k + 1:05d}-of-{parts:05d}.safetensors"
        chunk = names[k * len(names) // parts:(k + 1) * len(names) // parts]
        write(d / file, {n: tensors[n] for n in chunk})
        weight_map.update({n: file for n in chunk})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


def storage_bytes(t):
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.nbytes() if hasattr(t, "untyped_storage") else s.size() * t.element_size()


def test_every_tensor_in_file_order_from_a_file_a_folder_and_an_index(tmp_path):
    tensors = model()
    single = write(tmp_path / "model.safetensors", tensors)
    folder = sharded_dir(tmp_path, tensors)
    for source in (single, folder, folder / "model.safetensors.index.json"):
        it = ferry.iter_weights(source)
        got = list(it)
        assert [n for n, _ in got] == list(tensors)
        for name, t in got:
            assert t.dtype == tensors[name].dtype and torch.equal(t, tensors[name]), name
        assert it.report.tensors == len(tensors)
        assert it.report.bytes_read == sum(t.numel() * t.element_size() for t in tensors.values())


def test_a_later_read_never_overwrites_a_tensor_already_yielded(tmp_path):
    tensors = model(n=24)
    path = write(tmp_path / "model.safetensors", tensors)
    kept = []
    # A budget of three tensors: eight batches or more, their memory never reused.
    it = ferry.iter_weights(path, memory_budget=3 * 64 * 1024 * 4)
    for name, t in it:
        kept.append((name, t))
    assert len(it.report.loads) >= 8
    pointers = set()
    for name, t in kept:
        assert torch.equal(t, tensors[name]), f"{name} changed after it was yielded"
        if t.numel():
            assert storage_bytes(t) == t.numel() * t.element_size(), name  # its own allocation
            pointers.add(t.data_ptr())
    assert len(pointers) == sum(1 for t in tensors.values() if t.numel())


def test_read_ahead_stays_within_the_budget_and_a_larger_tensor_is_read_alone(tmp_path):
    tensors = model(n=16)
    tensors["huge"] = torch.randn(1024, 1024)  # 4 MiB, over the budget
    path = write(tmp_path / "model.safetensors", tensors)
    it = ferry.iter_weights(path, memory_budget=MiB)
    peak_before_huge = 0
    for name, _ in it:
        if name == "layers.15.w":
            peak_before_huge = it.report.peak_ahead_bytes
    assert 0 < peak_before_huge <= MiB
    assert it.report.peak_ahead_bytes == 4 * MiB
    assert it.report.budget == MiB and it.report.staging_bytes == 0


def test_into_a_gpu_the_budget_counts_ferrys_pinned_staging(tmp_path):
    from ferry import _weights
    assert _weights._staging_bytes({}) == 8 * 2 * 4 * MiB  # the default settings
    assert _weights._staging_bytes({"threads": 2, "bounce_buffer_size": "1MiB", "direct": True}) \
        == 2 * 2 * MiB


BOUNCE_CHILD = r"""
import ferry
from ferry import _weights
MiB = 1 << 20
assert _weights._bounce_for(256 * MiB, {}) == 2 * MiB  # 8 threads x 2 x 2 MiB = 32 MiB
assert _weights._bounce_for(1024 * MiB, {}) is None  # the default's 64 MiB fits 1/8 of 1 GiB
assert _weights._bounce_for(16 * MiB, {}) == MiB  # never under 1 MiB
assert _weights._bounce_for(256 * MiB, {"threads": 4}) is None  # 4 x 2 x 4 MiB = 32 MiB
# A size the caller chose, by argument, by ferry.settings or in the environment, is kept.
assert _weights._bounce_for(256 * MiB, {"bounce_buffer_size": "4MiB"}) is None
with ferry.settings(bounce_buffer_size="4MiB"):
    assert _weights._bounce_for(256 * MiB, {}) is None
print("ok")
"""


def test_into_a_gpu_the_default_staging_takes_at_most_an_eighth_of_the_budget():
    # A fresh process: this one's settings were set by the tests' fixture, so none is a default.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FERRY_", "KVIKIO_")) or k == "FERRY_CUDA_LIBRARY"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", BOUNCE_CHILD], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    env["FERRY_BOUNCE_BUFFER_SIZE"] = "4MiB"
    out = subprocess.run([sys.executable, "-c", "from ferry import _weights\n"
                          "print(_weights._bounce_for(256 << 20, {}))"], env=env,
                         capture_output=True, text=True)
    assert out.stdout.strip() == "None", out.stderr


def test_a_consumer_that_drops_each_tensor_keeps_peak_memory_flat(tmp_path):
    tensors = model(n=32, rows=256)  # 32 MiB of weights, 1 MiB each
    path = write(tmp_path / "model.safetensors", tensors)
    budget = 4 * MiB

    def peak(keep):
        kept = []
        tracemalloc.start()
        try:
            for name, a in ferry.iter_weights(path, memory_budget=budget, framework="numpy"):
                if keep:
                    kept.append(a)
                else:
                    float(a.reshape(-1)[:1].sum()) if a.size else None  # use it, then drop it
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    assert peak(keep=True) >= 32 * MiB  # tracemalloc sees the arrays' memory
    assert peak(keep=False) <= budget + 2 * MiB  # the budget, one tensor held, and slack


def test_names_reads_only_those_tensors(tmp_path):
    tensors = model()
    path = write(tmp_path / "model.safetensors", tensors)
    before = ferry.stats().bytes_read
    it = ferry.iter_weights(path, names=["layers.3.w", "norm"])
    assert [n for n, _ in it] == ["layers.3.w", "norm"]  # file order, not the list's
    assert it.report.bytes_read == 64 * 1024 * 4 + 1024 * 2
    assert ferry.stats().bytes_read - before <= it.report.bytes_read * 1.1
    it = ferry.iter_weights(path, names=lambda n: n.startswith("layers.1"))
    assert [n for n, _ in it] == ["layers.1.w", "layers.10.w", "layers.11.w"]
    with pytest.raises(ferry.CheckpointError, match=r"model\.safetensors.*'nope'"):
        ferry.iter_weights(path, names=["nope"])


def test_a_failed_read_names_the_file_and_the_tensor(tmp_path):
    tensors = model()
    path = write(tmp_path / "model.safetensors", tensors)
    it = iter(ferry.iter_weights(path, memory_budget=64 * 1024 * 4))
    next(it)
    os.truncate(path, os.path.getsize(path) - 64 * 1024 * 4 * 6)
    with pytest.raises(ferry.IoError, match=r"model\.safetensors.*reading tensor 'layers\.\d+\.w'"):
        list(it)


def test_leaving_early_waits_for_the_reads_in_flight(tmp_path):
    path = write(tmp_path / "model.safetensors", model())
    it = ferry.iter_weights(path, memory_budget=MiB)
    for name, _ in it:
        break
    assert it.report.tensors == 1
    with pytest.raises(RuntimeError, match="once"):
        iter(it)


def test_reads_start_from_the_consumers_thread_before_it_takes_the_tensor(tmp_path):
    """No thread of the iterator's own (a pool thread's hop delayed each read's start by a GIL
    hand-over); once tensor k is handed out, the reads that fit beside it are already in
    flight: their bytes counted in report.bytes_read."""
    tensors = model(n=12, rows=256)  # 1 MiB each
    path = write(tmp_path / "model.safetensors", tensors)
    it = ferry.iter_weights(path, memory_budget=3 * MiB)  # batches of one tensor, two in flight
    threads = set(threading.enumerate())
    started = []
    for name, t in it:
        assert set(threading.enumerate()) <= threads, "iter_weights started a thread"
        started.append(it.report.bytes_read)
        if name == "layers.0.w":
            assert it.report.bytes_read == 3 * MiB  # 0 yielded, 1 and 2 reading
        assert torch.equal(t, tensors[name])
    assert started[:3] == [3 * MiB, 4 * MiB, 5 * MiB]


def test_each_batch_ends_in_tasks_a_quarter_the_size_so_the_workers_finish_together(tmp_path):
    tensors = {"big": torch.randn(4 * MiB), "small": torch.randn(16)}  # 16 MiB, then 64 B
    path = write(tmp_path / "model.safetensors", tensors)
    it = ferry.iter_weights(path, memory_budget=64 * MiB, task_size="1MiB", host_nthreads=2)
    got = dict(it)
    assert all(torch.equal(got[n], tensors[n]) for n in tensors)
    # One batch: 14 MiB in tasks of 1 MiB (15 where the data does not start on a MiB), then the
    # last round (2 workers x 1 MiB) as 8 of 256 KiB, then `small`.
    assert [r.tasks for load in it.report.loads for r in load.routes] in ([23], [24])


def test_checkpoint_start_read_into_reads_while_the_caller_goes_on(tmp_path):
    from ferry.checkpoint import Checkpoint
    tensors = model()
    ckpt = Checkpoint(write(tmp_path / "model.safetensors", tensors))
    a = torch.empty(64, 1024)
    b = torch.empty(32 * 1024, dtype=torch.uint8)
    pending = ckpt.start_read_into([("layers.2.w", a), ("layers.5.w", b, 4096, 32 * 1024)])
    report = pending.result()
    assert ckpt.last_report is report and report.bytes == 64 * 1024 * 4 + 32 * 1024
    assert torch.equal(a, tensors["layers.2.w"])
    assert bytes(b.numpy()) == tensors["layers.5.w"].numpy().tobytes()[4096:4096 + 32 * 1024]
    with pytest.raises(ValueError, match="waited for already"):
        pending.result()
    # A slice's runs in one target, back to back (iter_weights' dim-1 slices: thousands).
    runs = [(r * 4096 + 1024, 512) for r in range(64)]
    d = torch.empty(64 * 512, dtype=torch.uint8)
    ckpt.start_read_into([("layers.3.w", d, runs)]).result()
    whole = tensors["layers.3.w"].numpy().tobytes()
    assert bytes(d.numpy()) == b"".join(whole[b:b + n] for b, n in runs)
    with pytest.raises(ValueError, match=r"'layers\.3\.w' needs 32768 bytes.*holds 32767"):
        ckpt.start_read_into([("layers.3.w", d[:-1], runs)])
    c = torch.empty(64, 1024)
    dropped = ckpt.start_read_into([("layers.7.w", c)])
    del dropped  # waits for its read
    assert torch.equal(c, tensors["layers.7.w"])


def test_evict_drops_the_files_pages_and_reports_the_bytes(tmp_path):
    tensors = model(n=16, rows=256)
    folder = sharded_dir(tmp_path, tensors, parts=2)
    files = sorted(str(p) for p in folder.glob("*.safetensors"))
    for f in files:
        with open(f, "rb") as fh:
            fh.read()  # into the page cache
    resident = [ferry.page_cache_residency(f, exact=True) for f in files]
    if not all(r.known for r in resident):
        pytest.skip(f"page-cache residency unknown here: {resident[0].why_not}")
    if sum(r.resident for r in resident) < sum(os.path.getsize(f) for f in files) // 2:
        pytest.skip("this file system keeps little of the files in the page cache")
    it = ferry.iter_weights(folder)
    assert sum(1 for _ in it) == len(tensors)
    assert it.report.evicted_bytes == 0  # not asked
    it = ferry.iter_weights(folder, evict=True)
    for name, t in it:
        assert torch.equal(t, tensors[name])
    after = [ferry.page_cache_residency(f, exact=True).resident for f in files]
    assert sum(after) <= sum(r.resident for r in resident) // 8, after
    assert it.report.evicted_files == 2
    assert it.report.evicted_bytes >= 16 * MiB
    with pytest.raises(ValueError, match="URL"):
        ferry.iter_weights("http://127.0.0.1:9/model.safetensors", evict=True)


@pytest.mark.gpu
def test_gpu_peak_memory_is_what_was_kept_plus_the_budget(tmp_path, torch):
    tensors = model(n=64, rows=1024)  # 256 MiB, 4 MiB each
    path = write(tmp_path / "model.safetensors", tensors)
    budget = 96 * MiB
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    it = ferry.iter_weights(path, device="cuda:0", memory_budget=budget)
    for name, t in it:
        assert torch.equal(t.cpu(), tensors[name]), name
        del t
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= budget, (peak, it.report)
    assert it.report.peak_ahead_bytes <= budget - it.report.staging_bytes


@pytest.mark.gpu
def test_gpu_a_consumer_on_its_own_stream_never_sees_a_later_read_in_its_tensors(tmp_path, torch):
    # torch hands a block freed on stream s to the next allocation on s at once; ferry's copies
    # are not queued on s. Each copy below waits behind a millisecond of GPU sleep on s, so a
    # read into the freed block that did not wait for s would land before the copy reads it.
    tensors = model(n=24, rows=1024)  # 4 MiB each
    path = write(tmp_path / "model.safetensors", tensors)
    params = {n: torch.empty(t.shape, dtype=t.dtype, device="cuda:0") for n, t in tensors.items()}
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for name, t in ferry.iter_weights(path, device="cuda:0", memory_budget=96 * MiB):
            torch.cuda._sleep(2_000_000)
            params[name].copy_(t)
            del t
    s.synchronize()
    bad = [n for n, t in tensors.items() if not torch.equal(params[n].cpu(), t)]
    assert not bad, f"{len(bad)} of {len(tensors)} tensors hold another tensor's bytes: {bad[:4]}"


@pytest.mark.gpu
def test_gpu_a_load_into_blocks_the_streams_queued_work_still_reads(tmp_path, torch):
    t = torch.full((1024, 1024), 3.0)
    path = write(tmp_path / "model.safetensors", {"w": t})
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.full((1024, 1024), 7.0, device="cuda:0")
        out = torch.empty_like(x)
        torch.cuda._sleep(20_000_000)
        out.copy_(x)
        del x  # its block goes to the next allocation on s: the load's
        loaded = ferry.load_checkpoint(path, device="cuda:0")
    s.synchronize()
    assert bool((out == 7).all()), "the load wrote into x's block before s's copy read it"
    assert torch.equal(loaded["w"].cpu(), t)


FAKE_GPU_CHILD = r'''
import ctypes, os, sys
import numpy as np
import ferry
from ferry import Shard, _weights

lib = ctypes.CDLL(os.environ["FERRY_CUDA_LIBRARY"])
assert lib.cuInit(0) == 0
ctx = ctypes.c_void_p()
assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0 and lib.cuCtxSetCurrent(ctx) == 0

class Dev:
    """Device memory of the double, freed when dropped."""
    def __init__(self, n):
        p = ctypes.c_uint64()
        assert lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(max(n, 1))) == 0
        self.ptr, self.n = p.value, n
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1",
                                         "data": (self.ptr, False), "version": 3}
    def host(self):
        out = (ctypes.c_char * self.n)()
        assert lib.cuMemcpyDtoH_v2(out, ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.n)) == 0
        return bytes(out)
    def __del__(self):
        lib.cuMemFree_v2(ctypes.c_uint64(self.ptr))

class DeviceFramework:
    host = False
    def raw(self, n):
        return Dev(n)
    def settle(self):
        pass
    def view(self, raw, entry):
        return raw

_weights._framework = lambda framework, device: DeviceFramework()
path = sys.argv[1]
full = {n: bytes(t.host()) for n, t in ferry.iter_weights(path, memory_budget=96 << 20)}
arrays = {n: np.frombuffer(b, np.float32).reshape(64, 1024) for n, b in full.items()
          if n.startswith("layers.")}
assert arrays["layers.3.w"].tobytes() == open(path + ".layer3", "rb").read()
it = ferry.iter_weights(path, memory_budget=96 << 20, shard=lambda n, s: Shard(1, 1, 3)
                        if n.startswith("layers.") else None)
for name, t in it:
    if name.startswith("layers."):
        want = np.ascontiguousarray(np.array_split(arrays[name], 3, axis=1)[1]).tobytes()
        assert t.host() == want, name
assert {r.memory for load in it.report.loads for r in load.routes} == {"gpu"}
print("fake-gpu iter_weights ok", it.report.bytes_read)
'''


def test_into_device_memory_of_the_libcuda_double_whole_and_dim1_slices(tmp_path):
    """Reads into GPU memory through the pinned staging (Checkpoint.start_read_into), whole
    tensors and dim-1 slices, on the libcuda double; skipped where FERRY_FAKE_CUDA is unset."""
    fake = os.environ.get("FERRY_FAKE_CUDA", "")
    if not os.path.exists(fake):
        pytest.skip("FERRY_FAKE_CUDA does not name the libcuda double (scripts/test sets it)")
    tensors = {f"layers.{i}.w": torch.randn(64, 1024) for i in range(6)}
    path = write(tmp_path / "model.safetensors", tensors)
    (tmp_path / "model.safetensors.layer3").write_bytes(tensors["layers.3.w"].numpy().tobytes())
    env = dict(os.environ, FERRY_CUDA_LIBRARY=fake)
    r = subprocess.run([sys.executable, "-c", FAKE_GPU_CHILD, path], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fake-gpu iter_weights ok" in r.stdout
