"""A stand-in for transformers where it is not installed (the CPU machine and CI), put on the
path of bench/checkpoint_bench.py's processes by tests/python/test_checkpoint_bench.py: the
pieces of it that the benchmark uses (LlamaConfig; LlamaForCausalLM, its save_pretrained and
from_pretrained), with the tensor names, shapes and shards of transformers' own Llama, so that
the benchmark runs its model cases as it does on the GPU machine, where transformers is
installed. Independent of ferry: it writes and reads safetensors files itself."""

from __future__ import annotations

import json
import os
import re
import struct
from typing import Any, Dict, List

import torch

__version__ = "0+ferry-stand-in"

_CODES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


class LlamaConfig:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class _Attention(torch.nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        head = c.hidden_size // c.num_attention_heads
        self.q_proj = torch.nn.Linear(c.hidden_size, c.hidden_size, bias=False)
        self.k_proj = torch.nn.Linear(c.hidden_size, head * c.num_key_value_heads, bias=False)
        self.v_proj = torch.nn.Linear(c.hidden_size, head * c.num_key_value_heads, bias=False)
        self.o_proj = torch.nn.Linear(c.hidden_size, c.hidden_size, bias=False)


class _Mlp(torch.nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = torch.nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = torch.nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = torch.nn.Linear(c.intermediate_size, c.hidden_size, bias=False)


class _Norm(torch.nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))


class _Layer(torch.nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(c)
        self.mlp = _Mlp(c)
        self.input_layernorm = _Norm(c.hidden_size)
        self.post_attention_layernorm = _Norm(c.hidden_size)


class _Model(torch.nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = torch.nn.ModuleList(_Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = _Norm(c.hidden_size)


def _bytes_of(size: Any) -> int:
    if isinstance(size, int):
        return size
    number, unit = re.fullmatch(r"(\d+)\s*([KMG]?B)", size.upper()).groups()
    return int(number) * {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}[unit]


def _write(path: str, tensors: Dict[str, torch.Tensor]) -> None:
    header: Dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs: List[bytes] = []
    offset = 0
    for name, t in tensors.items():
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def _read(path: str) -> Dict[str, torch.Tensor]:
    names = {code: dtype for dtype, code in _CODES.items()}
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        raw = torch.frombuffer(bytearray(data[8 + n + begin:8 + n + end]), dtype=torch.uint8)
        out[name] = raw.view(names[e["dtype"]]).reshape(e["shape"])
    return out


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Model(config)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def save_pretrained(self, path: str, safe_serialization: bool = True,
                        max_shard_size: Any = "5GB") -> None:
        """Shards of at most max_shard_size, named and indexed as transformers names them."""
        os.makedirs(path, exist_ok=True)
        limit = _bytes_of(max_shard_size)
        shards: List[Dict[str, torch.Tensor]] = [{}]
        size = 0
        for name, t in self.state_dict().items():
            nbytes = t.numel() * t.element_size()
            if shards[-1] and size + nbytes > limit:
                shards.append({})
                size = 0
            shards[-1][name] = t
            size += nbytes
        weight_map, total = {}, 0
        for k, shard in enumerate(shards):
            file = (f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1
                    else "model.safetensors")
            _write(os.path.join(path, file), shard)
            for name, t in shard.items():
                weight_map[name] = file
                total += t.numel() * t.element_size()
        if len(shards) > 1:
            with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(dict(vars(self.config)), f)

    @classmethod
    def from_pretrained(cls, path: str, torch_dtype: Any = None,
                        device_map: Any = None) -> "LlamaForCausalLM":
        with open(os.path.join(path, "config.json")) as f:
            config = LlamaConfig(**json.load(f))
        model = cls(config)
        if torch_dtype is not None:
            model = model.to(torch_dtype)
        state: Dict[str, torch.Tensor] = {}
        for file in sorted(os.listdir(path)):
            if file.endswith(".safetensors"):
                state.update(_read(os.path.join(path, file)))
        model.load_state_dict(state, strict=True)
        return model.to(device_map or "cpu").eval()
