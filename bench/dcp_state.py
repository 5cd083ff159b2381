"""The GPU state dicts that dcp.async_save is measured and tested with (bench/dcp_async_bench.py,
tests/python/test_dcp_async.py): bf16 layers of 256 MiB and a small optimizer state, the pinned
device-to-host bandwidth that bounds their staging, and the process's RSS. Needs torch with CUDA."""

import os
import time

import torch


def state(total_bytes, seed=0):
    """About `total_bytes` of bf16 model tensors on GPU 0 (256 MiB each) and an optimizer state."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = max(1, int(total_bytes // (256 << 20)))
    each = int(total_bytes // n) // 2
    sd = {"model": {f"layers.{i}.w": torch.randn(each, device="cuda", generator=g,
                                                  dtype=torch.bfloat16) for i in range(n)},
          "optim": {"state": {0: {"step": torch.tensor(3.0), "exp_avg":
                                  torch.randn(1000, device="cuda", generator=g)}},
                    "param_groups": [{"lr": 1e-3, "params": [0]}]}}
    torch.cuda.synchronize()
    return sd


def nbytes(sd):
    """The bytes of every tensor in the (nested) state dict."""
    out = 0
    for v in sd.values():
        if isinstance(v, dict):
            out += nbytes(v)
        elif isinstance(v, torch.Tensor):
            out += v.numel() * v.element_size()
    return out


def pinned_d2h_bandwidth(size):
    """Bytes per second of one GPU-to-pinned-host copy of `size` bytes, after one untimed copy."""
    src = torch.empty(int(size), dtype=torch.uint8, device="cuda")
    dst = torch.empty(int(size), dtype=torch.uint8, pin_memory=True)
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return size / (time.perf_counter() - t0)


def rss():
    """This process's resident set size in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
