"""Saving safetensors checkpoints from Python (host memory): byte layout against a reader written
here from the format description, round trips through ferry's loader for every dtype torch has,
zero-size and scalar tensors, metadata, safetensors' refusals, sharded saves with their index,
asynchronous saves, and the crash-consistency of a re-save killed at random moments."""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import ferry
from ferry.safetensors import numpy as fnp
from ferry.safetensors import torch as ftorch

torch = pytest.importorskip("torch")


def read_safetensors(data: bytes):
    """An independent reader: (metadata or None, [(name, dtype, shape, bytes)] in file order)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    body = data[8 + n:]
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"])
    end = 0
    out = []
    for name, info in items:
        b, e = info["data_offsets"]
        assert b == end, name
        end = e
        out.append((name, info["dtype"], info["shape"], body[b:e]))
    assert end == len(body)
    return meta, out


def all_torch_dtypes():
    names = ["bool", "uint8", "int8", "int16", "uint16", "float16", "bfloat16", "int32", "uint32",
             "float32", "int64", "uint64", "float64", "complex64", "float8_e4m3fn", "float8_e5m2",
             "float8_e8m0fnu", "float8_e4m3fnuz", "float8_e5m2fnuz"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


def sample(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        return (raw % 2).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.reshape(-1).view(torch.uint8) if a.dtype != torch.bool else a,
        b.reshape(-1).view(torch.uint8) if b.dtype != torch.bool else b)


def test_save_bytes_match_the_hand_computed_layout():
    tensors = {"b": torch.tensor([1.0, 2.0]), "c": torch.tensor([True, False, True]),
               "z": torch.empty((0, 2), dtype=torch.bfloat16), "a": torch.tensor(7)}
    data = ftorch.save(tensors, metadata={"format": "pt"})
    header = (b'{"__metadata__":{"format":"pt"},"a":{"dtype":"I64","shape":[],"data_offsets":[0,8]},'
              b'"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},'
              b'"z":{"dtype":"BF16","shape":[0,2],"data_offsets":[16,16]},'
              b'"c":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}}    ')
    body = struct.pack("<q", 7) + struct.pack("<2f", 1.0, 2.0) + b"\x01\x00\x01"
    assert data == struct.pack("<Q", 256) + header + body


def test_save_file_writes_the_same_bytes_as_save(tmp_path):
    tensors = {f"t{i}": sample(d, (3, 5), i) for i, d in enumerate(all_torch_dtypes())}
    ftorch.save_file(tensors, tmp_path / "m.safetensors", metadata={"k": "v"})
    assert (tmp_path / "m.safetensors").read_bytes() == ftorch.save(tensors, metadata={"k": "v"})
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_every_torch_dtype_zero_size_and_scalar_round_trips(tmp_path):
    tensors = {}
    for i, d in enumerate(all_torch_dtypes()):
        tensors[f"{d}.m"] = sample(d, (4, 3), i)
        tensors[f"{d}.s"] = sample(d, (), i + 100)
        tensors[f"{d}.e"] = torch.empty((0, 7), dtype=d)
    ftorch.save_file(tensors, tmp_path / "m.safetensors", metadata={"format": "pt", "x": "é\n"})
    back = ftorch.load_file(tmp_path / "m.safetensors")
    assert back.keys() == tensors.keys()
    for k in tensors:
        assert same(back[k], tensors[k]), k
    meta, entries = read_safetensors((tmp_path / "m.safetensors").read_bytes())
    assert meta == {"format": "pt", "x": "é\n"}
    by_name = {e[0]: e for e in entries}
    for k, t in tensors.items():
        assert by_name[k][2] == list(t.shape)
        assert by_name[k][3] == t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() \
            else by_name[k][3] == b""


def test_numpy_save_round_trips_and_matches_the_reader(tmp_path):
    arrays = {"f": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([True, False]),
              "big": np.arange(3, dtype=">i4"), "s": np.array(2.5), "e": np.zeros((0,), np.int16),
              "c": np.array([1 + 2j], np.complex64)}
    fnp.save_file(arrays, tmp_path / "n.safetensors")
    assert (tmp_path / "n.safetensors").read_bytes() == fnp.save(arrays)
    back = fnp.load_file(tmp_path / "n.safetensors")
    for k, a in arrays.items():
        assert back[k].shape == a.shape and np.array_equal(back[k], a), k
    _, entries = read_safetensors(fnp.save(arrays))
    assert {e[0]: e[1] for e in entries}["big"] == "I32"


def test_shared_and_overlapping_tensors_are_refused_as_safetensors_does(tmp_path):
    base = torch.zeros(10)
    with pytest.raises(RuntimeError, match="Some tensors share memory"):
        ftorch.save_file({"a": base, "b": base}, tmp_path / "x.safetensors")
    with pytest.raises(RuntimeError, match="share memory"):
        ftorch.save({"a": base[0:6], "b": base[4:10]})
    # Views of one storage that do not overlap are allowed, as in safetensors.
    data = ftorch.save({"a": base[0:5], "b": base[5:10]})
    assert len(read_safetensors(data)[1]) == 2
    assert not (tmp_path / "x.safetensors").exists()


def test_non_contiguous_tensors_and_bad_metadata_are_refused(tmp_path):
    with pytest.raises(ValueError, match="non contiguous tensor: `t`"):
        ftorch.save_file({"t": torch.zeros(4, 4).t()}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="non contiguous"):
        fnp.save({"t": np.zeros((4, 4))[:, ::2]})
    with pytest.raises(TypeError, match="str to str"):
        ftorch.save_file({"t": torch.zeros(1)}, tmp_path / "x.safetensors", metadata={"n": 1})
    with pytest.raises(ValueError, match="expected torch.Tensor"):
        ftorch.save({"t": np.zeros(1)})
    with pytest.raises(ValueError, match="Expected a dict"):
        ftorch.save([torch.zeros(1)])
    assert os.listdir(tmp_path) == []


def test_metadata_none_and_empty_differ_as_in_safetensors():
    t = {"x": torch.zeros(1, dtype=torch.uint8)}
    assert b"__metadata__" not in ftorch.save(t)
    assert b'"__metadata__":{}' in ftorch.save(t, metadata={})


def test_save_checkpoint_shards_and_index(tmp_path):
    tensors = {f"layer.{i}.w": torch.full((64,), float(i)) for i in range(5)}  # 256 B each
    report = ferry.save_checkpoint(tensors, tmp_path / "ck", max_shard_size=600,
                                   metadata={"format": "pt"})
    assert sorted(os.listdir(tmp_path / "ck")) == [
        "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors", "model.safetensors.index.json"]
    assert report.files[-1].endswith("model.safetensors.index.json")
    index = json.loads((tmp_path / "ck" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 5 * 256
    # transformers-style reading: every weight_map file, then each tensor from its file.
    for name, file in index["weight_map"].items():
        part = ftorch.load_file(tmp_path / "ck" / file)
        assert torch.equal(part[name], tensors[name])
    back = ferry.load_checkpoint(tmp_path / "ck", device="cpu")
    assert all(torch.equal(back[k], v) for k, v in tensors.items())


def test_max_shard_size_takes_transformers_strings():
    from ferry._save import parse_size
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("500MiB") == 500 << 20
    assert parse_size(None) == 0 and parse_size(123) == 123
    with pytest.raises(ValueError, match="max_shard_size"):
        parse_size("lots")


def test_max_shard_size_and_the_settings_read_a_size_alike():
    """Regression (issue 46): "5GB" was 5 * 10**9 bytes here and 5 GiB as a setting."""
    from ferry._save import parse_size
    for text in ("5GB", "300KB", "7MB", "500MiB", "4M", "4096"):
        assert parse_size(text) == ferry._ferry.parse_size(text), text
    ferry.settings.task_size = "5MB"
    try:
        assert ferry.settings.task_size == 5 * 10**6
    finally:
        ferry.settings.task_size = "4MiB"


def test_asynchronous_save_returns_a_future_and_writes_the_same_bytes(tmp_path):
    tensors = {f"w{i}": sample(torch.bfloat16, (256, 256), i) for i in range(8)}
    fut = ftorch.save_file(tensors, tmp_path / "a.safetensors", asynchronous=True)
    report = fut.result(timeout=60)
    assert report.tensors == 8
    assert (tmp_path / "a.safetensors").read_bytes() == ftorch.save(tensors)
    fut = ferry.save_checkpoint(tensors, tmp_path / "ck", max_shard_size="300KB",
                                asynchronous=True)
    assert len(fut.result(timeout=60).files) == 5  # 4 shards of 2 tensors, the index


def test_snapshot_lets_the_caller_change_the_tensors_at_once(tmp_path):
    tensors = {"w": torch.arange(1 << 16, dtype=torch.float32)}
    expected = ftorch.save(tensors)
    fut = ftorch.save_file(tensors, tmp_path / "s.safetensors", asynchronous=True, snapshot=True)
    tensors["w"].fill_(-1)
    fut.result(timeout=60)
    assert (tmp_path / "s.safetensors").read_bytes() == expected


def _mount_tmpfs(path, options):
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {r.stderr.strip()}")


def test_full_disk_raises_enospc_naming_the_file_and_keeps_the_old_one(tmp_path):
    _mount_tmpfs(tmp_path, "size=256k")
    try:
        (tmp_path / "m.safetensors").write_bytes(b"old")
        with pytest.raises(ferry.IoError) as e:
            ftorch.save_file({"w": torch.zeros(1 << 18)}, tmp_path / "m.safetensors")
        assert e.value.errno == 28  # ENOSPC
        assert str(tmp_path / "m.safetensors") in e.value.filename
        assert (tmp_path / "m.safetensors").read_bytes() == b"old"
        assert os.listdir(tmp_path) == ["m.safetensors"]
    finally:
        subprocess.run(["umount", "-l", str(tmp_path)])


def test_read_only_folder_raises_erofs_naming_the_file(tmp_path):
    _mount_tmpfs(tmp_path, "size=1m,ro")
    try:
        with pytest.raises(OSError) as e:
            ferry.save_checkpoint({"w": torch.zeros(4)}, tmp_path)
        assert e.value.errno == 30  # EROFS
        assert str(tmp_path) in str(e.value)
    finally:
        subprocess.run(["umount", "-l", str(tmp_path)])


_CHILD = textwrap.dedent("""
    import sys, numpy, ferry
    directory, value = sys.argv[1], float(sys.argv[2])
    arrays = {f"layer.{i}.w": numpy.full((1 << 16,), value + i, numpy.float32) for i in range(12)}
    print("ready", flush=True)
    ferry.save_checkpoint(arrays, directory, max_shard_size=1 << 20)
    print("done", flush=True)
""")


def _generation(directory):
    """The value the checkpoint in `directory` was saved with; fails on a mix."""
    back = ferry.load_checkpoint(directory, device="cpu", framework="numpy")
    assert len(back) == 12
    base = {float(back[f"layer.{i}.w"][0]) - i for i in range(12)}
    assert len(base) == 1, f"a mix of checkpoints: {sorted(base)}"
    value = base.pop()
    for i in range(12):
        assert np.all(back[f"layer.{i}.w"] == value + i)
    return value


def test_a_resave_killed_at_random_moments_leaves_the_old_or_the_new_checkpoint(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    ferry.save_checkpoint({f"layer.{i}.w": np.full((1 << 16,), 0.0 + i, np.float32)
                           for i in range(12)}, tmp_path, max_shard_size=1 << 20)
    rng = random.Random(33)
    seen = {"old": 0, "new": 0}
    old = 0.0
    for run in range(20):
        new = float((run + 1) * 100)
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path), str(new)],
                                 stdout=subprocess.PIPE, env=env)
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0, 0.12))
        child.send_signal(signal.SIGKILL)
        child.wait()
        got = _generation(tmp_path)
        assert got in (old, new), (run, got)
        seen["new" if got == new else "old"] += 1
        old = got
        for name in os.listdir(tmp_path):
            if name.startswith("model"):  # a final name: always a complete file
                if name.endswith(".safetensors"):
                    fnp.load_file(tmp_path / name)
    print(f"kills that left the old checkpoint: {seen['old']}, the new one: {seen['new']}")
    ferry.save_checkpoint({"x": np.zeros(1)}, tmp_path)
    leftovers = [n for n in os.listdir(tmp_path) if ".ferry-" in n]
    assert leftovers == []


# ---- issue 45: names, paths and permissions ---------------------------------------------------


def test_a_lone_surrogate_in_a_name_or_metadata_is_a_value_error_naming_it(tmp_path):
    path = tmp_path / "m.safetensors"
    bad = "w\udc80"
    with pytest.raises(ValueError, match=r"tensor name 'w\\udc80' is not valid text"):
        ftorch.save_file({bad: torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="metadata key"):
        ftorch.save_file({"w": torch.zeros(2)}, str(path), metadata={bad: "x"})
    with pytest.raises(ValueError, match="tensor name"):
        ferry.save_checkpoint({bad: torch.zeros(2)}, str(tmp_path / "ckpt"))
    assert os.listdir(tmp_path) == []


def test_a_path_of_undecodable_bytes_saves_under_that_name(tmp_path):
    name = os.fsdecode(b"m\xff.safetensors")  # a surrogate escape, as os.listdir gives it
    ftorch.save_file({"w": torch.arange(3)}, os.path.join(str(tmp_path), name))
    assert os.listdir(tmp_path) == [name]
    assert ftorch.load_file(os.path.join(str(tmp_path), name))["w"].tolist() == [0, 1, 2]


def test_an_empty_path_or_state_dict_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OSError, match="empty path"):
        ftorch.save_file({"w": torch.zeros(2)}, "")
    with pytest.raises(OSError, match="empty path"):
        ferry.save_checkpoint({"w": torch.zeros(2)}, "")
    with pytest.raises(OSError, match="no tensors to save"):
        ferry.save_checkpoint({}, str(tmp_path / "ckpt"))
    assert os.listdir(tmp_path) == []


def test_files_are_made_with_the_umask_of_the_process_from_every_thread(tmp_path):
    """Finding 3: ferry's umask(0)/umask(mask) pair raced with other threads, whose files (and
    ferry's own, from asynchronous saves) came out 0666."""
    old = os.umask(0o077)
    try:
        futures = [ferry.save_checkpoint({"w": torch.full((4,), i)}, str(tmp_path / f"c{i}"),
                                         asynchronous=True) for i in range(40)]
        made = []
        for i in range(200):
            p = tmp_path / f"other{i}"
            fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o666)
            os.close(fd)
            made.append(p)
        for f in futures:
            f.result()
    finally:
        os.umask(old)
    modes = {oct(os.stat(p).st_mode & 0o777) for p in made}
    modes |= {oct(os.stat(tmp_path / f"c{i}" / name).st_mode & 0o777)
              for i in range(40) for name in os.listdir(tmp_path / f"c{i}")}
    assert modes == {oct(0o600)}


# ---- safetensors' load(bytes), save_model and load_model (issue 47) ---------------------------


def test_load_of_bytes_gives_what_save_wrote_in_owned_memory():
    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor(7),
               "e": torch.zeros((0, 4), dtype=torch.bfloat16), "i": torch.arange(5)}
    blob = ftorch.save(tensors, metadata={"format": "pt"})
    back = ftorch.load(blob)
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k
    back["a"][0, 0] = 99  # owns its memory: the bytes object is immutable
    arrays = fnp.load(fnp.save({"x": np.arange(4, dtype=np.int16)}))
    assert arrays["x"].tolist() == [0, 1, 2, 3] and arrays["x"].flags.writeable
    with pytest.raises(ferry.CheckpointError, match="<bytes>"):
        ftorch.load(blob[:20])


def _tied_model():
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=True)
            self.head.weight = self.embed.weight
    return Tied()


def test_save_model_drops_tied_names_and_load_model_restores_them(tmp_path):
    torch.manual_seed(0)
    model = _tied_model()
    path = tmp_path / "model.safetensors"
    ftorch.save_model(model, str(path))
    from ferry.safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    saved = ftorch.load_file(str(path))
    assert set(saved) == {"embed.weight", "head.bias"}
    assert meta == {"head.weight": "embed.weight"}
    other = _tied_model()
    missing, unexpected = ftorch.load_model(other, str(path))
    assert missing == [] and unexpected == []
    assert torch.equal(other.head.weight, model.embed.weight)
    assert other.head.weight.data_ptr() == other.embed.weight.data_ptr()
    ftorch.save_file({"embed.weight": saved["embed.weight"]}, str(tmp_path / "partial.safetensors"))
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "head.bias"'):
        ftorch.load_model(_tied_model(), str(tmp_path / "partial.safetensors"))
    missing, _ = ftorch.load_model(_tied_model(), str(tmp_path / "partial.safetensors"),
                                   strict=False)
    assert missing == ["head.bias"]


@pytest.mark.parametrize("url", ["s3://bucket/ckpt/", "http://127.0.0.1:1/ckpt",
                                 "https://user:secret@example.com/ckpt?X-Amz-Signature=abc"])
def test_a_save_to_a_url_is_refused_and_writes_nothing(tmp_path, monkeypatch, url):
    # Before: "s3://bucket/ckpt/" was a local path, the save made the folders s3:/bucket/ckpt
    # here and reported success.
    monkeypatch.chdir(tmp_path)
    tensors = {"w": torch.arange(4, dtype=torch.float32)}
    for save in (lambda: ferry.save_checkpoint(tensors, url),
                 lambda: ftorch.save_file(tensors, url + "/model.safetensors"),
                 lambda: fnp.save_file({"w": np.arange(4.0)}, url + "/model.safetensors")):
        with pytest.raises(OSError, match="remote objects are read-only in ferry") as e:
            save()
        assert "secret" not in str(e.value) and "Signature" not in str(e.value)
    assert not list(tmp_path.iterdir()), "nothing was created locally"


def test_saves_wait_once_for_each_gpus_current_stream(monkeypatch):
    """ferry's copies run on streams of its own: before a save reads GPU tensors, the work queued
    on the current stream of each GPU they are on is waited for, once a GPU (CPU tensors: none)."""
    from types import SimpleNamespace

    from ferry import _streams

    waited = []
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device: SimpleNamespace(synchronize=lambda: waited.append(device)))
    on = [SimpleNamespace(device=torch.device(d)) for d in ("cuda:1", "cpu", "cuda:0", "cuda:1")]
    _streams.wait_for_torch(iter(on))
    assert sorted(str(d) for d in waited) == ["cuda:0", "cuda:1"]
    waited.clear()
    _streams.wait_for_torch([torch.zeros(2)])
    assert waited == []
