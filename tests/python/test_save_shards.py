"""save_checkpoint's shard layout against transformers' save_pretrained: which tensor goes to which
shard, the shards' names and order, and the index (metadata.total_size, metadata.total_parameters,
weight_map, the JSON text). The reference is huggingface_hub's split_torch_state_dict_into_shards
restated below from its rules (src/checkpoint/shard_assignment.cc lists them with their sources),
and huggingface_hub itself where it is installed."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import struct
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

import ferry

torch = pytest.importorskip("torch")

INDEX = "model.safetensors.index.json"


Item = Tuple[str, int, Optional[Any]]


def hub_split(items: List[Item], limit: int) -> Tuple[Dict[str, List[str]], int]:
    """huggingface_hub's split, restated: `items` are (name, bytes, storage id or None) in the
    dict's order, a torch tensor's bytes being its storage's (get_torch_storage_size); returns
    ({file: names, in shard order}, total_size)."""
    finished: List[List[str]] = []  # a shard joins this list when it is done
    filling: List[str] = []
    filling_bytes = 0
    owner: Dict[Any, str] = {}  # storage id -> the first name seen with it
    deferred: List[Tuple[str, Any]] = []
    total = 0
    for name, nbytes, storage in items:
        if storage is not None and storage in owner:
            deferred.append((name, storage))  # placed with its storage's first tensor, unsized
            continue
        if storage is not None:
            owner[storage] = name
        total += nbytes
        if nbytes > limit:  # too big for any shard: one of its own, done at once
            finished.append([name])
            continue
        if filling_bytes + nbytes > limit:
            finished.append(filling)
            filling, filling_bytes = [], 0
        filling.append(name)
        filling_bytes += nbytes
    if filling:
        finished.append(filling)
    for name, storage in deferred:
        next(shard for shard in finished if owner[storage] in shard).append(name)
    n = len(finished)
    files = (["model.safetensors"] if n == 1 else
             [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)])
    return dict(zip(files, finished)), total


def storage_id(t: Any) -> Tuple[str, int, int]:
    """(device, storage address, storage bytes): how huggingface_hub tells storages apart."""
    try:
        s = t.untyped_storage()
        return str(t.device), s.data_ptr(), s.nbytes()
    except AttributeError:  # torch < 2
        s = t.storage()
        return str(t.device), s.data_ptr(), s.size() * t.element_size()


def shard_names(path) -> List[str]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return sorted(header)


def check_layout(directory, tensors: Dict[str, Any], limit: int) -> None:
    """ferry's save of `tensors` in `directory` is laid out as save_pretrained lays it out."""
    # A torch tensor is sized by its storage, as huggingface_hub sizes it (a view of a larger
    # storage counts as all of it); an array by its own bytes.
    items = [(k, storage_id(v)[2] if storage_id(v)[1] else v.numel() * v.element_size(),
              storage_id(v)) if hasattr(v, "numel") else (k, int(v.nbytes), None)
             for k, v in tensors.items()]
    files, total = hub_split(items, limit)
    on_disk = sorted(p.name for p in directory.iterdir() if p.name != INDEX)
    assert on_disk == sorted(files)
    for file, names in files.items():
        assert shard_names(directory / file) == sorted(names), file
    index = json.loads((directory / INDEX).read_text())
    assert index["weight_map"] == {name: file for file, names in files.items() for name in names}
    params = sum(math.prod(v.shape) for v in tensors.values())
    assert index["metadata"] == {"total_size": total, "total_parameters": params}


def random_sizes(rng: random.Random, limit: int) -> List[int]:
    # Sizes around the limit, so that exact fits, one byte over, oversized and empty all come up.
    picks = [0, 1, limit - 1, limit, limit + 1, 2 * limit]
    return [rng.choice(picks) if rng.random() < 0.4 else rng.randint(1, 2 * limit)
            for _ in range(rng.randint(1, 10))]


@pytest.mark.parametrize("seed", range(6))
def test_random_sizes_shard_as_huggingface_hub_splits_them(tmp_path, seed):
    rng = random.Random(seed)
    for case in range(25):
        limit = rng.randint(2, 40)
        sizes = random_sizes(rng, max(limit, 2))
        use_torch = rng.random() < 0.5
        make = ((lambda n, i: torch.full((n,), i, dtype=torch.uint8)) if use_torch else
                (lambda n, i: np.full(n, i, np.uint8)))
        tensors = {f"t{i:02d}.{rng.randint(0, 99)}": make(n, i) for i, n in enumerate(sizes)}
        directory = tmp_path / f"c{case}"
        ferry.save_checkpoint(tensors, directory, max_shard_size=limit, durable=False)
        check_layout(directory, tensors, limit)


def test_an_oversized_tensor_mid_stream_gets_its_shard_before_the_one_being_filled(tmp_path):
    tensors = {"a": np.zeros(4, np.uint8), "big": np.zeros(10, np.uint8),
               "b": np.zeros(4, np.uint8)}
    ferry.save_checkpoint(tensors, tmp_path, max_shard_size=8, durable=False)
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["weight_map"] == {"big": "model-00001-of-00002.safetensors",
                                   "a": "model-00002-of-00002.safetensors",
                                   "b": "model-00002-of-00002.safetensors"}
    assert index["metadata"] == {"total_size": 18, "total_parameters": 18}


def test_views_of_one_storage_share_the_first_ones_shard_and_count_as_the_storage(tmp_path):
    base = torch.arange(12, dtype=torch.float32)
    tensors = {"q": base[0:4], "x": torch.ones(4), "k": base[4:8], "y": torch.ones(4),
               "v": base[8:12], "scalar": torch.tensor(2.0)}
    ferry.save_checkpoint(tensors, tmp_path, max_shard_size=32, durable=False)
    check_layout(tmp_path, tensors, 32)
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["weight_map"]["k"] == index["weight_map"]["v"] == index["weight_map"]["q"]
    # q counts as its whole storage (48 bytes: over the limit, a shard of its own), k and v add
    # nothing: huggingface_hub's sizes (found against it on the GPU machine).
    assert index["metadata"]["total_size"] == 48 + 16 + 16 + 4
    assert index["weight_map"]["q"] == "model-00001-of-00003.safetensors"
    assert index["metadata"]["total_parameters"] == 12 + 4 + 4 + 1
    back = ferry.load_checkpoint(tmp_path, device="cpu")
    assert all(torch.equal(back[k], v) for k, v in tensors.items())


def test_one_shard_is_model_safetensors_with_an_index_beside_it(tmp_path):
    # save_pretrained writes no index for one shard; ferry does (docs/checkpoints.md says why).
    tensors = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    ferry.save_checkpoint(tensors, tmp_path, max_shard_size="1MB", durable=False)
    check_layout(tmp_path, tensors, 10**6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", INDEX]


def test_the_index_text_is_what_json_dumps_writes_for_it(tmp_path):
    tensors = {"z": np.zeros(3, np.float32), "é.weight": np.zeros(2, np.float16),
               "日本\x7f\U0001F600": np.zeros(5, np.uint8), "a": np.zeros((), np.int64)}
    ferry.save_checkpoint(tensors, tmp_path, max_shard_size=10, durable=False)
    text = (tmp_path / INDEX).read_text(encoding="utf-8")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert list(json.loads(text)["metadata"]) == ["total_parameters", "total_size"]


@pytest.mark.skipif(importlib.util.find_spec("huggingface_hub") is None,
                    reason="huggingface_hub is not installed (not on the CPU machine; its split is "
                           "restated in hub_split above)")
def test_huggingface_hub_itself_splits_as_ferry_does(tmp_path):
    from huggingface_hub import split_torch_state_dict_into_shards
    rng = random.Random(7)
    for case in range(40):
        limit = rng.randint(2, 40)
        base = torch.zeros(3 * limit, dtype=torch.uint8)
        tensors = {f"t{i}": torch.full((n,), i % 250, dtype=torch.uint8)
                   for i, n in enumerate(random_sizes(rng, limit))}
        if rng.random() < 0.5:  # views of one storage, placed at random
            names = list(tensors)
            for j in range(3):
                names.insert(rng.randint(0, len(names)), f"view{j}")
                tensors[f"view{j}"] = base[j * limit:(j + 1) * limit]
            tensors = {k: tensors[k] for k in names}
        directory = tmp_path / f"c{case}"
        ferry.save_checkpoint(tensors, directory, max_shard_size=limit, durable=False)
        split = split_torch_state_dict_into_shards(tensors, max_shard_size=limit)
        index = json.loads((directory / INDEX).read_text())
        assert index["weight_map"] == split.tensor_to_filename
        assert index["metadata"]["total_size"] == split.metadata["total_size"]
        on_disk = sorted(p.name for p in directory.iterdir() if p.name != INDEX)
        assert on_disk == sorted(split.filename_to_tensors)
        for file, names in split.filename_to_tensors.items():
            assert shard_names(directory / file) == sorted(names)
