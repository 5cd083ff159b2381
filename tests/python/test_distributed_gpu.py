"""ferry.distributed on GPUs (skipped, saying why, without them): a file split across every GPU
of this process lands byte for byte; checkpoints loaded into two GPUs from two threads at once
are equal to the file; and, with two GPUs or more, ranks over NCCL load replicated and sharded
checkpoints equal to the full tensors, a missing file on one rank failing every rank."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading

import numpy as np
import pytest

import ferry
import ferry.distributed as fd
from test_distributed import PLAN, REPO, expected, free_port, write_sharded, write_single

pytestmark = pytest.mark.gpu


def gpus(torch, need=1):
    n = torch.cuda.device_count()
    if n < need:
        pytest.skip(f"{n} GPU(s) here, the test needs {need}")
    return n


def test_read_split_lands_the_file_on_every_gpu(torch, tmp_path):
    n = gpus(torch)
    data = np.random.default_rng(5).integers(0, 256, (32 << 20) + 777, dtype=np.uint8)
    path = tmp_path / "f.bin"
    path.write_bytes(data.tobytes())
    split = fd.read_split(str(path), "all", offset=4096)
    assert split.devices == list(range(n)) and split.bytes == data.size - 4096
    at = 4096
    for d, a, (offset, size), route in zip(split.devices, split.arrays, split.parts, split.routes):
        assert offset == at and a.device == torch.device("cuda", d) and route.memory == "gpu"
        assert np.array_equal(a.cpu().numpy(), data[offset:offset + size])
        at += size
    assert at == data.size and "GB/s in all" in split.summary()
    fd.prepare_devices("all")  # again: cheap, no error
    raw = fd.read_split(str(path), list(range(n))[::-1], prepare=False)  # the pool as it is
    assert raw.devices == list(range(n))[::-1]
    joined = np.concatenate([a.cpu().numpy() for a in raw.arrays])
    assert np.array_equal(joined, data)


def test_two_gpus_from_two_threads_at_once(torch, tmp_path):
    gpus(torch, 2)
    path, tensors = write_single(tmp_path)
    fd.prepare_devices([0, 1])
    out, errors = {}, []

    def load(d):
        try:
            out[d] = ferry.load_checkpoint(path, device=f"cuda:{d}")
        except BaseException as e:  # checked below
            errors.append(e)

    threads = [threading.Thread(target=load, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for d in (0, 1):
        for name, _, shape, data in tensors:
            t = out[d][name]
            assert t.device == torch.device("cuda", d) and tuple(t.shape) == tuple(shape)
            assert bytes(t.cpu().reshape(-1).view(torch.uint8).numpy()) == data


NCCL_WORKER = r'''
import datetime, os, pickle, sys
import torch, torch.distributed as dist
import ferry.distributed as fd
out_dir, single, sharded, plan = sys.argv[1], sys.argv[2], sys.argv[3], eval(sys.argv[4])
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
results = {}
def record(key, tensors):
    assert all(t.device == torch.device("cuda", local) for t in tensors.values())
    results[key] = {"tensors": {n: (tuple(t.shape), bytes(t.cpu().reshape(-1).view(torch.uint8).numpy()))
                                for n, t in tensors.items()},
                    "report": fd.last_load_report().to_dict()}
record("replicated", fd.load_checkpoint(single))
record("small_buckets", fd.load_checkpoint(sharded, bucket_size=4096))
record("one_allocation", fd.load_checkpoint(single, one_allocation=True))
record("plan", fd.load_checkpoint(sharded, plan=plan))
try:
    fd.load_checkpoint(single + (".missing" if rank == 1 else ""))
    results["missing"] = None
except fd.DistributedLoadError as e:
    results["missing"] = sorted(e.failures)
record("after", fd.load_checkpoint(single))
pickle.dump(results, open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb"))
dist.destroy_process_group()
'''


def test_nccl_ranks_load_replicated_and_sharded(torch, tmp_path):
    world = gpus(torch, 2)
    single, t_single = write_single(tmp_path)
    sharded, t_sharded = write_sharded(tmp_path)
    script = tmp_path / "worker.py"
    script.write_text(NCCL_WORKER)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world), PYTHONPATH=os.path.join(REPO, "python"), **fd.MULTICAST_OFF)
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path), single, sharded,
                               repr(PLAN)], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for r in range(world)]
    texts = [p.communicate(timeout=300)[0].decode(errors="replace") for p in procs]
    for p, text in zip(procs, texts):
        assert p.returncode == 0, text[-4000:]
    for r in range(world):
        res = pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes())
        for key, tensors, plan in [("replicated", t_single, None), ("small_buckets", t_sharded, None),
                                   ("one_allocation", t_single, None), ("plan", t_sharded, PLAN),
                                   ("after", t_single, None)]:
            want = expected(tensors, world, r, plan)
            got = res[key]["tensors"]
            assert {n: (tuple(s), d) for n, (s, d) in want.items()} == got, key
            assert res[key]["report"]["bytes_read"] == sum(len(t[3]) for t in tensors)
            assert res[key]["report"]["engine"].startswith("torch.distributed nccl")
        assert res["missing"] == [1]
