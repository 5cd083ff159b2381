#!/usr/bin/env python3
"""Golden torch.distributed.checkpoint (DCP) folders for ferry's tests (issue 51), written by
stock DCP on a machine whose torch has it (the GPU machine's torch 2.11; Debian's 1.13 cannot
import it), so CI can check ferry's reader against what stock writes.

Writes, under OUTDIR:
  single/     dcp.save of a model + optimizer-like state dict in one process, no process group:
              bf16, fp16, fp32 and int64 tensors, a non-contiguous view, 0-d and empty tensors,
              non-tensor items (ints, floats, strings, a list) that DCP stores as pickled bytes,
              and nested optimizer state (state.<param>.exp_avg ...).
  two_ranks/  the same kinds saved by 2 ranks through gloo, with tensors sharded along dim 0
              and dim 1 (DTensor on a CPU mesh) and a replicated one.
  expected.json  for each folder, each flattened name as .metadata lists it: dtype, shape and
              the sha256 of the tensor's bytes in C order (or the repr of a non-tensor item),
              read back by stock dcp.load.
Usage: python3 bench/dcp_golden.py OUTDIR
"""

import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp


def state_dict(rank_seed=0):
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(8, 6, generator=g)
    return {
        "model": {
            "embed.weight": torch.randn(16, 4, generator=g).to(torch.bfloat16),
            "layers.0.attn.w": w.to(torch.float16),
            "layers.0.attn.w_t": w.t(),  # a non-contiguous view
            "layers.0.bias": torch.randn(6, generator=g),
            "layers.0.count": torch.arange(5, dtype=torch.int64),
            "scale": torch.tensor(0.5),
            "empty": torch.zeros(0, 3),
        },
        "optim": {
            "state": {
                "0": {"step": torch.tensor(7.0), "exp_avg": torch.randn(8, 6, generator=g),
                      "exp_avg_sq": torch.rand(8, 6, generator=g)},
                "1": {"step": torch.tensor(7.0), "exp_avg": torch.randn(6, generator=g),
                      "exp_avg_sq": torch.rand(6, generator=g)},
            },
            "param_groups": [{"lr": 3e-4, "betas": [0.9, 0.95], "params": ["0", "1"],
                              "name": "decay"}],
        },
        "step": 1000,
        "note": "golden",
    }


def digest(value):
    if isinstance(value, torch.Tensor):
        t = value.detach().contiguous().cpu()
        flat = t.reshape(-1)
        data = flat.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                "sha256": hashlib.sha256(data).hexdigest()}
    return {"value": repr(value)}


def read_back(path):
    """Stock dcp.load of every key .metadata lists, into freshly made tensors."""
    reader = dcp.FileSystemReader(path)
    md = reader.read_metadata()
    sd = {}
    for name, item in md.state_dict_metadata.items():
        if hasattr(item, "size"):  # TensorStorageMetadata
            sd[name] = torch.empty(item.size, dtype=item.properties.dtype)
        else:
            sd[name] = None  # BytesStorageMetadata: dcp.load fills it in
    dcp.load(sd, storage_reader=reader, no_dist=True)
    return {name: digest(v) for name, v in sorted(sd.items())}


def two_ranks_worker(rank, path, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2,))
    full = state_dict()
    m = full["model"]
    sharded = {
        "model": {
            "embed.weight": distribute_tensor(m["embed.weight"], mesh, [Shard(0)]),
            "layers.0.attn.w": distribute_tensor(m["layers.0.attn.w"], mesh, [Shard(1)]),
            "layers.0.bias": distribute_tensor(m["layers.0.bias"], mesh, [Replicate()]),
            "layers.0.count": m["layers.0.count"],
        },
        "optim": full["optim"],
        "step": full["step"],
    }
    dcp.save(sharded, checkpoint_id=path)
    dist.barrier()
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    single = os.path.join(out, "single")
    dcp.save(state_dict(), checkpoint_id=single, no_dist=True)
    two = os.path.join(out, "two_ranks")
    mp.spawn(two_ranks_worker, args=(two, 29517), nprocs=2, join=True)
    expected = {"torch": torch.__version__}
    for name, path in (("single", single), ("two_ranks", two)):
        expected[name] = read_back(path)
        expected[name + "_files"] = sorted(os.listdir(path))
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
    # What stock's FileSystemWriter wrote, for the record.
    for name in ("single", "two_ranks"):
        path = os.path.join(out, name)
        print(name, {f: os.path.getsize(os.path.join(path, f)) for f in sorted(os.listdir(path))})
    print("keys", {k: len(v) for k, v in expected.items() if isinstance(v, dict)})
    # The classes .metadata's pickle names: what ferry's allow-list must admit, and no more.
    import pickle

    class Recorder(pickle.Unpickler):
        seen = set()

        def find_class(self, module, name):
            Recorder.seen.add(f"{module}.{name}")
            return super().find_class(module, name)

    for name in ("single", "two_ranks"):
        with open(os.path.join(out, name, ".metadata"), "rb") as f:
            Recorder(f).load()
    print("classes", sorted(Recorder.seen))


if __name__ == "__main__":
    main()
