"""The distributed engines ferry exchanges bytes over: ``torch.distributed`` (NCCL for GPU
tensors, gloo for CPU ones) and MPI through ``mpi4py``. Never a transport of ferry's own. A Comm
offers the four operations the loader needs; ranks are those of the group (0..size-1)."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence


class Comm:
    rank: int = 0
    size: int = 1
    backend: str = ""

    def allgather_object(self, obj: Any) -> List[Any]:
        """Every rank's `obj` (small, picklable), in rank order, on every rank."""
        raise NotImplementedError

    def broadcast(self, buf: Any, src: int) -> None:
        """`buf` (a contiguous 1-D byte array) of rank `src` into every rank's `buf`."""
        raise NotImplementedError

    def scatter(self, out: Any, chunks: Optional[Sequence[Any]], src: int) -> None:
        """chunks[r] of rank `src` into rank r's `out`; every chunk is out's size."""
        raise NotImplementedError

    def synchronize(self, device: Any) -> None:
        """Waits until the exchange work queued so far has landed."""

    def describe(self) -> str:
        return f"{self.backend}, {self.size} rank(s)"


class TorchComm(Comm):
    """A torch.distributed process group (None: the default one, every rank of the world)."""

    def __init__(self, group: Any = None) -> None:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ferry.distributed: torch.distributed is not initialized: call "
                               "torch.distributed.init_process_group() first (torchrun sets the "
                               "environment it reads)")
        self.dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group))
        if group is None or group is getattr(dist, "GroupMember").WORLD:
            self._global = list(range(self.size))
        else:
            get = getattr(dist, "get_global_rank", None)
            if get is None:  # torch < 2.0
                from torch.distributed import distributed_c10d
                get = distributed_c10d._get_global_rank
            self._global = [get(group, r) for r in range(self.size)]

    def allgather_object(self, obj: Any) -> List[Any]:
        out: List[Any] = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast(self, buf: Any, src: int) -> None:
        self.dist.broadcast(buf, src=self._global[src], group=self.group)

    def scatter(self, out: Any, chunks: Optional[Sequence[Any]], src: int) -> None:
        self.dist.scatter(out, list(chunks) if chunks is not None else None,
                          src=self._global[src], group=self.group)

    def synchronize(self, device: Any) -> None:
        import torch
        if getattr(device, "type", "cpu") == "cuda":
            torch.cuda.synchronize(device)

    def describe(self) -> str:
        return f"torch.distributed {self.backend}, {self.size} rank(s)"


class MpiComm(Comm):
    """An mpi4py communicator. Host arrays are NumPy's; GPU arrays (CuPy) need a CUDA-aware
    MPI. CuPy's queued work is waited for before each MPI call, which does not see streams."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.backend = "mpi"

    @staticmethod
    def _ready(buf: Any) -> None:
        if type(buf).__module__.split(".")[0] == "cupy":
            import cupy
            cupy.cuda.get_current_stream().synchronize()

    def allgather_object(self, obj: Any) -> List[Any]:
        return list(self.comm.allgather(obj))

    def broadcast(self, buf: Any, src: int) -> None:
        self._ready(buf)
        self.comm.Bcast(buf, root=src)

    def scatter(self, out: Any, chunks: Optional[Sequence[Any]], src: int) -> None:
        send = None
        if self.rank == src:
            assert chunks is not None
            xp = __import__(type(out).__module__.split(".")[0])
            send = xp.concatenate(list(chunks))
            self._ready(send)
        self._ready(out)
        self.comm.Scatter(send, out, root=src)

    def describe(self) -> str:
        return f"MPI (mpi4py), {self.size} rank(s)"


def comm_for(group: Any) -> Comm:
    """The Comm for `group`: a Comm as is, an mpi4py communicator, or a torch.distributed
    group (None: the default group)."""
    if isinstance(group, Comm):
        return group
    if group is not None and type(group).__module__.split(".")[0] == "mpi4py":
        return MpiComm(group)
    return TorchComm(group)


__all__ = ["Comm", "MpiComm", "TorchComm", "comm_for"]
