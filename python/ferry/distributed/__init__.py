"""Checkpoints onto many GPUs, each byte read from storage once.

    import torch.distributed as dist, ferry.distributed
    dist.init_process_group("nccl")                      # torchrun sets the environment
    state = ferry.distributed.load_checkpoint("/models/llama")          # every rank, all tensors
    shard = ferry.distributed.load_checkpoint("/models/llama",          # each rank its slices
                                              plan={"lm_head.weight": 0, "o_proj.weight": 1})
    print(ferry.distributed.last_load_report())

Each rank reads a balanced share of the checkpoint's bytes from storage into its GPU, then the
ranks exchange the rest over the group's engine (NCCL or gloo through torch.distributed, or MPI
through mpi4py): N ranks read one copy, not N. Sharded tensors are read by the rank that owns
the slice when it is contiguous in the file (dimension 0), else once by one rank and scattered.
A rank's failure to open or read becomes a DistributedLoadError on every rank.

Several GPUs in one process: ``read_split(path, [0, 1])`` reads a file split across GPUs at
once; ``prepare_devices`` gives concurrent reads into several GPUs workers of their own.

The planning (who reads which bytes, how slices map) is pure: ``plan_load``. See
docs/distributed.md.
"""

from ._comm import Comm, MpiComm, TorchComm, comm_for
from ._load import (DistributedLoadError, DistributedLoadReport, RankReport, last_load_report,
                    load_checkpoint)
from ._local import SplitRead, gpu_count, parse_devices, prepare_devices, read_split, split_range
from ._plan import (Broadcast, Piece, Plan, Slice, TensorSpec, merge_regions, plan_broadcasts,
                    plan_load, resolve_shard_plan, split_points)

# NVLink multicast (NVLS) stays off on the machines ferry is measured on: every launcher of
# ours (tests, bench/distributed_bench.py, the commands in docs/distributed.md) puts these in the
# environment of the processes it starts. The library itself leaves the environment alone.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                 "NVSHMEM_DISABLE_NVLS": "1"}

__all__ = [
    "Broadcast", "Comm", "DistributedLoadError", "DistributedLoadReport", "MULTICAST_OFF",
    "MpiComm", "Piece", "Plan", "RankReport", "Slice", "SplitRead", "TensorSpec", "TorchComm",
    "comm_for", "gpu_count", "last_load_report", "load_checkpoint", "merge_regions",
    "parse_devices", "plan_broadcasts", "plan_load", "prepare_devices", "read_split",
    "resolve_shard_plan", "split_points", "split_range",
]
