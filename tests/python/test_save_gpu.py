"""Saving CUDA tensors (needs a GPU and PyTorch; skipped with the reason otherwise): the file's
bytes equal those of the same tensors saved from the CPU, the async form's too, and a sharded
save from GPU memory loads back onto the GPU tensor by tensor."""

from __future__ import annotations

import pytest

import ferry
from ferry.safetensors import torch as ftorch

pytestmark = pytest.mark.gpu


def _tensors(torch, device):
    g = torch.Generator().manual_seed(33)
    out = {f"w{i}": torch.randn(1000 + i, 129, generator=g).to(torch.bfloat16)
           for i in range(16)}
    out["ids"] = torch.arange(77, dtype=torch.int64)
    out["scalar"] = torch.tensor(3.5)
    out["empty"] = torch.empty(0, 3)
    return {k: v.to(device) for k, v in out.items()}


def test_cuda_tensors_save_the_bytes_of_their_cpu_copies(torch, tmp_path):
    gpu = _tensors(torch, "cuda:0")
    cpu = {k: v.cpu() for k, v in gpu.items()}
    ftorch.save_file(gpu, tmp_path / "g.safetensors", metadata={"format": "pt"})
    expected = ftorch.save(cpu, metadata={"format": "pt"})
    assert (tmp_path / "g.safetensors").read_bytes() == expected
    assert ftorch.save(gpu, metadata={"format": "pt"}) == expected
    ftorch.save_file(gpu, tmp_path / "a.safetensors", metadata={"format": "pt"},
                     asynchronous=True).result(timeout=120)
    assert (tmp_path / "a.safetensors").read_bytes() == expected


def test_sharded_save_from_gpu_loads_back_on_the_gpu(torch, tmp_path):
    gpu = _tensors(torch, "cuda:0")
    ferry.save_checkpoint(gpu, tmp_path, max_shard_size="1MB")
    back = ferry.load_checkpoint(tmp_path, device="cuda:0")
    assert back.keys() == gpu.keys()
    for k, v in gpu.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k
