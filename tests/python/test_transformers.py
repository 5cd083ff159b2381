"""ferry.transformers without transformers: the fallback decisions, the reports, and the patch
going in and coming out, against a small stand-in for transformers 5's loading seam
(``modeling_utils.safe_open`` and ``PreTrainedModel._load_pretrained_model``) that loads as
transformers does (the files and dtype first, ``_get_dtype``, then the model built, then lazy
slices, ``[...]`` and ``.to(device, dtype)``, then tying). Needs torch (CPU is enough). The same
checks against the real transformers on a GPU are in test_transformers_gpu.py."""

from __future__ import annotations

import gc
import inspect
import json
import os
import struct
import sys
import threading
import time
import types
import weakref
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ferry.transformers as ft  # noqa: E402

# ------------------------------------------------------------------ a stand-in for transformers 5

_TORCH = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64}
_NAMES = {v: k for k, v in _TORCH.items()}


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class StockSlice:
    def __init__(self, raw, entry):
        self.raw, self.entry = raw, entry

    def get_shape(self):
        return list(self.entry["shape"])

    def get_dtype(self):
        return self.entry["dtype"]

    def __getitem__(self, index):
        begin, end = self.entry["data_offsets"]
        flat = torch.frombuffer(bytearray(self.raw[begin:end]), dtype=torch.uint8) \
            if end > begin else torch.empty(0, dtype=torch.uint8)
        return flat.view(_TORCH[self.entry["dtype"]]).reshape(self.entry["shape"])[index]


class stock_safe_open:
    """safetensors' safe_open as the stand-in's "stock" reader (pure Python, in memory)."""

    opened = []

    def __init__(self, filename, framework, device="cpu", backend=None):
        stock_safe_open.opened.append(os.fspath(filename))
        with open(filename, "rb") as f:
            blob = f.read()
        (n,) = struct.unpack("<Q", blob[:8])
        self.header = json.loads(blob[8:8 + n])
        self.header.pop("__metadata__", None)
        self.raw = memoryview(blob)[8 + n:]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def keys(self):
        return list(self.header)

    def get_slice(self, name):
        return StockSlice(self.raw, self.header[name])


@dataclass
class LoadStateDictConfig:
    device_map: object = None
    dtype: object = None
    hf_quantizer: object = None
    device_mesh: object = None
    disable_mmap: object = None


class TinyModel(torch.nn.Module):
    """Embedding tied to the output layer, a layer with a bias, a non-persistent buffer."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.proj = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.register_buffer("inv_freq", torch.arange(4, dtype=torch.float32), persistent=False)

    def tie(self):
        self.head.weight = self.embed.weight


# The stand-in's tensor-parallel plan, by checkpoint name, and how transformers cuts each style
# out of a lazy slice (integrations/tensor_parallel.py: get_tensor_shard's ceil-sized range on
# one dimension, empty past the end; get_packed_weights' row lists for a fused gate-up block;
# slice[...] for what it replicates).
TP_PLAN = {"embed.weight": "colwise", "proj.gamma": "colwise", "proj.bias": "colwise",
           "gate_up.weight": "packed_colwise", "down.weight": "rowwise", "norm.weight": None}


def tp_part(slice_, style, rank, world):
    shape = slice_.get_shape()
    if style is None:
        return slice_[...]
    if style == "packed_colwise":
        half = shape[0] // 2
        rows = [b + i for b in (0, half) for i in range(rank * (half // world),
                                                         (rank + 1) * (half // world))]
        return slice_[rows, ...]
    dim = 0 if style == "colwise" else len(shape) - 1
    step = -(-shape[dim] // world)
    start, end = rank * step, min(rank * step + step, shape[dim])
    if start >= shape[dim]:
        return torch.empty([0 if d == dim else n for d, n in enumerate(shape)])
    if style == "rowwise":
        return slice_[..., start:end]
    index = [slice(None)] * len(shape)
    index[dim] = slice(start, end)
    return slice_[tuple(index)]


class Mesh:
    """What the loaders ask of a torch DeviceMesh: this rank and the mesh's size."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world

    def get_rank(self):
        return self.rank

    def size(self):
        return self.world


def make_modeling_utils(state):
    mu = types.ModuleType("transformers.modeling_utils")
    mu.safe_open = stock_safe_open
    mu.is_deepspeed_zero3_enabled = lambda: state["zero3"]

    def _get_dtype(dtype, checkpoint_files, config, sharded_metadata, state_dict, weights_only,
                   hf_quantizer):
        return config, dtype

    def caching_allocator_warmup(model, expanded_device_map, hf_quantizer):
        state["warmups"].append(expanded_device_map)

    mu._get_dtype = _get_dtype
    mu.caching_allocator_warmup = caching_allocator_warmup

    class PreTrainedModel:
        @staticmethod
        def _load_pretrained_model(model, state_dict, checkpoint_files, load_config,
                                   expected_keys=None):
            merged, pointers = {}, []
            if load_config.device_map is not None:
                mu.caching_allocator_warmup(model, load_config.device_map, None)
            if state_dict is not None:
                merged = state_dict
            else:
                for file in checkpoint_files:
                    if file.endswith(".bin"):
                        merged.update(torch.load(file))
                        continue
                    pointer = mu.safe_open(file, framework="pt", device=state["open_on"],
                                           backend="mmap")
                    pointers.append(pointer)
                    for k in pointer.keys():
                        merged[k] = pointer.get_slice(k)
            mesh = load_config.device_mesh
            if mesh is not None:  # each rank keeps its part (the model's TP hooks are not here)
                model.tp_shards = {
                    name: tp_part(value, TP_PLAN[name], mesh.get_rank(), mesh.size()).to(
                        load_config.dtype) for name, value in sorted(merged.items())}
                return {"loaded": sorted(merged)}, None
            device = (load_config.device_map or {"": "cpu"})[""]
            for name, value in sorted(merged.items()):
                renamed = name.replace(".gamma", ".weight")  # a key rename, as transformers does
                tensor = value[...].to(device=device, dtype=load_config.dtype)
                module, _, attr = renamed.rpartition(".")
                setattr(model.get_submodule(module), attr, torch.nn.Parameter(tensor))
            model.tie()
            for p in pointers:
                p.__exit__(None, None, None)
            return {"loaded": sorted(merged)}, None

        @classmethod
        def from_pretrained(cls, path, device_map=None, dtype=torch.float32, tp_plan=None,
                            device_mesh=None):
            files = sorted(os.path.join(path, f) for f in os.listdir(path)
                           if f.endswith((".safetensors", ".bin")))
            _, dtype = mu._get_dtype(dtype, files, None, None, None, True, None)
            state["build"]()  # transformers builds the model (and imports lazily) here
            model = TinyModel()
            if isinstance(device_map, str):
                device_map = {"": device_map}
            config = LoadStateDictConfig(device_map=device_map, dtype=dtype,
                                         device_mesh=device_mesh)
            cls._load_pretrained_model(model, None, files, config)
            return model

    mu.PreTrainedModel = PreTrainedModel
    return mu


def stand_in(setitem):
    """The stand-in transformers package, put into sys.modules with `setitem`; its state."""
    state = {"zero3": False, "warmups": [], "build": lambda: None, "open_on": "cpu"}
    package = types.ModuleType("transformers")
    package.__version__ = "5.0.stand-in"
    mu = make_modeling_utils(state)
    package.modeling_utils = mu
    setitem(sys.modules, "transformers", package)
    setitem(sys.modules, "transformers.modeling_utils", mu)
    return mu, state


@pytest.fixture
def fake_transformers(monkeypatch):
    """A stand-in transformers package in sys.modules; the test fails if ferry's patch is
    still installed when it ends."""
    mu, state = stand_in(monkeypatch.setitem)
    stock_safe_open.opened = []
    yield types.SimpleNamespace(mu=mu, state=state)
    assert not ft.is_enabled(), "a test left ferry's patch installed"


def weights(seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(16, 8, generator=g).to(dtype),
            "proj.gamma": torch.randn(8, 8, generator=g).to(dtype),
            "proj.bias": torch.randn(8, generator=g).to(dtype)}


@pytest.fixture
def sharded(tmp_path):
    """A two-shard checkpoint (its embedding tied to the head, one key to rename)."""
    w = weights()
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors",
                      {"embed.weight": w["embed.weight"]})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors",
                      {"proj.gamma": w["proj.gamma"], "proj.bias": w["proj.bias"]})
    return str(tmp_path)


def assert_same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    assert torch.equal(a.inv_freq, b.inv_freq)
    assert (a.head.weight.data_ptr() == a.embed.weight.data_ptr()) == \
        (b.head.weight.data_ptr() == b.embed.weight.data_ptr())


# ------------------------------------------------------------------ the patch


def test_enable_and_disable_put_back_transformers_own_functions(fake_transformers):
    mu = fake_transformers.mu
    load = inspect.getattr_static(mu.PreTrainedModel, "_load_pretrained_model")
    assert ft.enable() is True
    assert mu.safe_open is not stock_safe_open
    assert inspect.getattr_static(mu.PreTrainedModel, "_load_pretrained_model") is not load
    ft.disable()
    assert mu.safe_open is stock_safe_open
    assert inspect.getattr_static(mu.PreTrainedModel, "_load_pretrained_model") is load


def test_loading_block_inside_enable_leaves_the_patch_to_disable(fake_transformers):
    ft.enable()
    with ft.loading():
        with ft.loading():
            assert ft.is_enabled()
        assert ft.is_enabled()
    assert ft.is_enabled()
    ft.disable()
    assert not ft.is_enabled()


def test_loading_block_removes_the_patch_even_when_the_load_raises(fake_transformers):
    with pytest.raises(ZeroDivisionError):
        with ft.loading():
            1 / 0
    assert fake_transformers.mu.safe_open is stock_safe_open


def test_a_seam_of_another_shape_warns_and_leaves_transformers_stock(fake_transformers):
    mu = fake_transformers.mu

    class Other:
        @staticmethod
        def _load_pretrained_model(cls, model, state_dict, resolved_archive_file):
            return None

    mu.PreTrainedModel = Other
    with pytest.warns(RuntimeWarning, match=r"5.0.stand-in is left stock: .*takes \(cls, model"):
        assert ft.enable() is False
    assert mu.safe_open is stock_safe_open and not ft.is_enabled()
    ft.disable()
    with pytest.warns(RuntimeWarning, match="left stock"):
        with ft.loading():
            assert not ft.is_enabled()
    assert "_load_pretrained_model" not in vars(Other) or \
        inspect.getattr_static(Other, "_load_pretrained_model").__func__.__name__ == \
        "_load_pretrained_model"


def test_safe_open_outside_a_served_load_is_safetensors_own(fake_transformers, sharded):
    with ft.loading():
        handle = fake_transformers.mu.safe_open(
            os.path.join(sharded, "model-00001-of-00002.safetensors"), framework="pt")
    assert isinstance(handle, stock_safe_open)


# ------------------------------------------------------------------ decisions


def test_decide_names_why_each_load_stays_stock(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"")
    files = [str(f)]
    cfg = LoadStateDictConfig
    cases = [
        (dict(state_dict={"a": 1}, checkpoint_files=None, load_config=cfg()), "state_dict"),
        (dict(state_dict=None, checkpoint_files=[], load_config=cfg()), "no checkpoint files"),
        (dict(state_dict=None, checkpoint_files=[str(tmp_path / "pytorch_model.bin")],
              load_config=cfg()), "pytorch_model.bin is not safetensors"),
        (dict(state_dict=None, checkpoint_files=files, load_config=cfg(hf_quantizer=object())),
         "quantized"),
        (dict(state_dict=None, checkpoint_files=files, load_config=cfg(), deepspeed_zero3=True),
         "ZeRO-3"),
        (dict(state_dict=None, checkpoint_files=files, load_config=cfg(disable_mmap=True)),
         "disable_mmap"),
        (dict(state_dict=None, checkpoint_files=files,
              load_config=cfg(device_map={"model": "cuda:0", "lm_head": "cpu"})),
         "device_map spans cpu, cuda:0"),
        (dict(state_dict=None, checkpoint_files=files,
              load_config=cfg(device_map={"model": 0, "lm_head": "disk"})), "'disk'"),
        (dict(state_dict=None, checkpoint_files=files, load_config=cfg(device_map={"": "mps"})),
         "host or CUDA memory only"),
        (dict(state_dict=None, checkpoint_files=[str(tmp_path / "gone.safetensors")],
              load_config=cfg()), "is not a local file"),
        (dict(state_dict=None, checkpoint_files=files, load_config=cfg(),
              on_hf_mount=lambda p: True), "hf-mount"),
        (dict(state_dict=None, checkpoint_files=files, load_config=object()), "no device_map"),
    ]
    for kwargs, reason in cases:
        device, why = ft.decide(**kwargs)
        assert device is None and reason in why, (kwargs, why)


def test_decide_serves_one_device_however_the_map_spells_it(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"")
    cfg = LoadStateDictConfig
    assert ft.decide(None, [str(f)], cfg()) == ("cpu", "")
    assert ft.decide(None, [str(f)], cfg(device_map={"": "cpu"})) == ("cpu", "")
    spelt = {"model.embed": 1, "model.layers": "cuda:1", "lm_head": torch.device("cuda", 1)}
    assert ft.decide(None, [str(f)], cfg(device_map=spelt)) == ("cuda:1", "")


# ------------------------------------------------------------------ loads


def test_load_through_ferry_makes_the_model_stock_makes(fake_transformers, sharded):
    PreTrainedModel = fake_transformers.mu.PreTrainedModel
    stock = PreTrainedModel.from_pretrained(sharded, dtype=torch.float32)
    stock_opened = list(stock_safe_open.opened)
    stock_safe_open.opened = []
    with ft.loading():
        model = PreTrainedModel.from_pretrained(sharded, dtype=torch.float32)
    assert stock_safe_open.opened == [] and len(stock_opened) == 2
    assert_same_model(model, stock)
    assert model.head.weight.data_ptr() == model.embed.weight.data_ptr()
    assert model.proj.weight.dtype == torch.float32  # cast as asked, after ferry's read
    report = ft.last_load_report()
    assert report.taken == "ferry" and report.device == "cpu" and report.model == "TinyModel"
    assert [os.path.basename(f.path) for f in report.files] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert [f.bytes for f in report.files] == [16 * 8 * 2, (8 * 8 + 8) * 2]
    assert all(f.taken == "ferry" and f.seconds > 0 and f.gbps > 0 and f.route
               for f in report.files)
    assert report.load_seconds >= report.read_seconds > 0
    assert json.loads(json.dumps(report.to_dict()))["taken"] == "ferry"
    assert "ferry" in str(report)


def test_function_form_loads_through_ferry_and_unpatches(fake_transformers, sharded):
    model = ft.from_pretrained(fake_transformers.mu.PreTrainedModel, sharded,
                               dtype=torch.bfloat16)
    assert model.embed.weight.dtype == torch.bfloat16
    assert torch.equal(model.embed.weight, weights()["embed.weight"])
    assert ft.last_load_report().taken == "ferry"
    assert fake_transformers.mu.safe_open is stock_safe_open


def test_pickle_checkpoint_loads_stock_and_the_report_says_why(fake_transformers, tmp_path):
    torch.save({"embed.weight": weights()["embed.weight"].float(),
                "proj.gamma": weights()["proj.gamma"].float(),
                "proj.bias": weights()["proj.bias"].float()}, tmp_path / "pytorch_model.bin")
    with ft.loading():
        model = fake_transformers.mu.PreTrainedModel.from_pretrained(str(tmp_path))
    assert torch.equal(model.embed.weight, weights()["embed.weight"].float())
    report = ft.last_load_report()
    assert report.taken == "stock" and report.files[0].taken == "stock"
    assert "pytorch_model.bin is not safetensors" in report.files[0].reason


def test_deepspeed_zero3_loads_stock(fake_transformers, sharded):
    fake_transformers.state["zero3"] = True
    with ft.loading():
        fake_transformers.mu.PreTrainedModel.from_pretrained(sharded)
    assert len(stock_safe_open.opened) == 2
    assert all("ZeRO-3" in f.reason for f in ft.last_load_report().files)


def test_a_file_ferry_cannot_read_falls_back_to_stock_alone(fake_transformers, sharded,
                                                           monkeypatch):
    real = ft.Checkpoint

    def flaky(path, *a, **k):
        if path.endswith("00002-of-00002.safetensors"):
            raise ferry_error(path)
        return real(path, *a, **k)

    def ferry_error(path):
        return OSError(f"pread {path} offset=0 len=8: Input/output error")

    monkeypatch.setattr(ft, "Checkpoint", flaky)
    stock = fake_transformers.mu.PreTrainedModel.from_pretrained(sharded)
    stock_safe_open.opened = []
    with ft.loading():
        model = fake_transformers.mu.PreTrainedModel.from_pretrained(sharded)
    assert_same_model(model, stock)
    assert [os.path.basename(p) for p in stock_safe_open.opened] == [
        "model-00002-of-00002.safetensors"]
    first, second = ft.last_load_report().files
    assert first.taken == "ferry"
    assert second.taken == "stock" and "Input/output error" in second.reason
    assert ft.last_load_report().taken == "mixed"


def test_a_slice_hands_its_tensor_over_and_reads_it_again_if_asked_twice(fake_transformers, sharded):
    path = os.path.join(sharded, "model-00002-of-00002.safetensors")
    served = ft._ServedFiles([path], "cpu", ft.TransformersLoadReport("m", "cpu"))
    handle = served.handle(path)
    s = handle.get_slice("proj.gamma")
    assert s.get_shape() == [8, 8] and s.get_dtype() == "BF16"
    first = s[...]
    assert "proj.gamma" not in handle.tensors  # handed over: a cast copy frees the original
    second = s[...]
    assert torch.equal(first, weights()["proj.gamma"]) and torch.equal(second, first)
    assert first.data_ptr() != second.data_ptr()
    unused = weakref.ref(handle.tensors["proj.bias"])
    handle.__exit__(None, None, None)  # what transformers does once the load is over
    assert unused() is None
    with pytest.raises(ValueError, match="no such tensor"):
        handle.get_slice("missing.weight")


def test_loads_in_two_threads_each_serve_their_own_files(fake_transformers, tmp_path):
    dirs = []
    for seed in (1, 2):
        d = tmp_path / f"m{seed}"
        d.mkdir()
        w = weights(seed)
        write_safetensors(d / "model.safetensors", w)
        dirs.append(str(d))
    results = {}

    def load(d):
        results[d] = fake_transformers.mu.PreTrainedModel.from_pretrained(d)

    with ft.loading():
        threads = [threading.Thread(target=load, args=(d,)) for d in dirs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for seed, d in zip((1, 2), dirs):
        assert torch.equal(results[d].embed.weight, weights(seed)["embed.weight"].float())
    assert stock_safe_open.opened == []


def test_numbers_in_the_report_add_up():
    report = ft.TransformersLoadReport("M", "cuda:0", [
        ft.FileReport("/a.safetensors", "ferry", "read", 2_000_000_000, 0.5, "route"),
        ft.FileReport("/b.safetensors", "ferry", "read", 1_000_000_000, 0.25, "route")])
    assert report.bytes == 3_000_000_000
    assert [f.gbps for f in report.files] == [4.0, 4.0]
    assert ft.FileReport("/c", "stock", "why").gbps is None
    assert np.isclose(report.to_dict()["files"][0]["gbps"], 4.0)


def test_a_shrinking_cast_reads_each_tensor_when_transformers_takes_it(fake_transformers,
                                                                      tmp_path):
    w = weights(3, torch.float32)
    write_safetensors(tmp_path / "model.safetensors", w)
    stock = fake_transformers.mu.PreTrainedModel.from_pretrained(str(tmp_path),
                                                                 dtype=torch.bfloat16)
    with ft.loading():
        model = fake_transformers.mu.PreTrainedModel.from_pretrained(str(tmp_path),
                                                                     dtype=torch.bfloat16)
    assert_same_model(model, stock)
    assert model.embed.weight.dtype == torch.bfloat16
    (f,) = ft.last_load_report().files
    assert f.taken == "ferry" and f.route.startswith("on demand") and "shrinks" in f.reason
    assert f.bytes == sum(t.numel() * 4 for t in w.values()) and f.seconds > 0
    assert ft.last_load_report().read_seconds == f.seconds


def test_packed_dtypes_stay_stock(fake_transformers, tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    write_safetensors(path, weights())
    served = ft._ServedFiles([str(path)], "cpu", ft.TransformersLoadReport("m", "cpu"))
    real = ft.Checkpoint

    def packed(p, *a, **k):
        c = real(p, *a, **k)
        c.entries["proj.bias"].dtype = "F4"
        return c

    monkeypatch.setattr(ft, "Checkpoint", packed)
    assert served.handle(str(path)) is None
    served.finish()
    (f,) = served.report.files
    assert f.taken == "stock" and "'proj.bias' is F4" in f.reason


def test_keyword_calls_of_the_seam_pass_through_as_peft_makes_them(fake_transformers, sharded):
    files = sorted(os.path.join(sharded, f) for f in os.listdir(sharded))
    model = TinyModel()
    with ft.loading():
        info, _ = fake_transformers.mu.PreTrainedModel._load_pretrained_model(
            model=model, state_dict=None, checkpoint_files=files,
            load_config=LoadStateDictConfig(), expected_keys=["proj.weight"])
    assert info["loaded"] == ["embed.weight", "proj.bias", "proj.gamma"]
    assert ft.last_load_report().taken == "ferry" and stock_safe_open.opened == []


# ------------------------------------------------------------------ the early start


def read_threads():
    return [t for t in threading.enumerate() if t.name.startswith("ferry-hf-read")]


def test_reads_start_before_the_model_is_built(fake_transformers, sharded, monkeypatch):
    started = threading.Event()
    real_load = ft.Checkpoint.load

    def load(self, *a, **k):
        started.set()
        return real_load(self, *a, **k)

    monkeypatch.setattr(ft.Checkpoint, "load", load)
    seen = {}

    def build():  # the model's construction waits until ferry's reads have begun
        seen["read_began"] = started.wait(timeout=5)

    fake_transformers.state["build"] = build
    stock = fake_transformers.mu.PreTrainedModel.from_pretrained(sharded, dtype=torch.float32)
    started.clear()
    with ft.loading():
        model = fake_transformers.mu.PreTrainedModel.from_pretrained(sharded, dtype=torch.float32)
    assert seen["read_began"]
    assert_same_model(model, stock)
    report = ft.last_load_report()
    assert report.taken == "ferry" and report.early == "started before the model was built"
    assert 0 <= report.read_started_s < report.model_built_s
    assert "started before the model was built" in str(report)
    assert report.to_dict()["read_started_s"] == report.read_started_s
    assert read_threads() == []


def test_the_warmup_is_skipped_where_ferry_already_holds_the_weights(fake_transformers, sharded):
    warmups = fake_transformers.state["warmups"]
    fake_transformers.mu.PreTrainedModel.from_pretrained(sharded, device_map="cpu")
    assert len(warmups) == 1  # stock warms the allocator up
    with ft.loading():
        fake_transformers.mu.PreTrainedModel.from_pretrained(sharded, device_map="cpu")
    assert len(warmups) == 1 and ft.last_load_report().taken == "ferry"
    tmp = os.path.join(sharded, "f32")
    os.mkdir(tmp)
    write_safetensors(os.path.join(tmp, "model.safetensors"), weights(3, torch.float32))
    with ft.loading():  # a shrinking cast reads nothing up front: the warm-up stays
        fake_transformers.mu.PreTrainedModel.from_pretrained(tmp, device_map="cpu",
                                                             dtype=torch.bfloat16)
    assert len(warmups) == 2 and ft.last_load_report().files[0].route.startswith("on demand")


def test_a_failed_background_read_names_the_file_and_stock_reads_it(fake_transformers, sharded,
                                                                    monkeypatch):
    real_load = ft.Checkpoint.load

    def load(self, *a, **k):
        if self.shards[0].endswith("00002-of-00002.safetensors"):
            raise OSError(f"pread {self.shards[0]} offset=0 len=144: Input/output error")
        return real_load(self, *a, **k)

    monkeypatch.setattr(ft.Checkpoint, "load", load)
    stock = fake_transformers.mu.PreTrainedModel.from_pretrained(sharded)
    stock_safe_open.opened = []
    with ft.loading():
        model = fake_transformers.mu.PreTrainedModel.from_pretrained(sharded)
    assert_same_model(model, stock)
    first, second = ft.last_load_report().files
    assert first.taken == "ferry" and second.taken == "stock"
    assert "could not read it" in second.reason
    assert ft.last_load_report().early == "started before the model was built"
    assert "00002-of-00002.safetensors offset=0 len=144: Input/output error" in second.reason


def test_an_error_of_the_read_thread_reaches_the_caller(fake_transformers, sharded, monkeypatch):
    def broken(ckpts, dtype):
        raise RuntimeError(f"the plan of the reads failed in {threading.current_thread().name}")

    monkeypatch.setattr(ft, "_shrinking_cast", broken)
    with ft.loading():
        with pytest.raises(RuntimeError, match="failed in ferry-hf-read"):
            fake_transformers.mu.PreTrainedModel.from_pretrained(sharded)
    assert read_threads() == []


def test_from_pretrained_raising_before_it_takes_the_tensors_frees_the_reads(
        fake_transformers, sharded, monkeypatch):
    real_load = ft.Checkpoint.load
    read = []

    def slow_load(self, *a, **k):
        time.sleep(0.2)  # still reading when the model's construction fails
        tensors = real_load(self, *a, **k)
        read.extend(weakref.ref(t) for t in tensors.values())
        return tensors

    def build():
        raise ValueError("the model's __init__ failed")

    monkeypatch.setattr(ft.Checkpoint, "load", slow_load)
    fake_transformers.state["build"] = build
    with ft.loading():
        with pytest.raises(ValueError, match="__init__ failed"):
            fake_transformers.mu.PreTrainedModel.from_pretrained(sharded)
    assert read_threads() == []
    gc.collect()
    assert len(read) == 3 and all(r() is None for r in read)
    assert "dropped: from_pretrained ended before it took the tensors" in \
        ft.last_load_report().early


def test_reads_the_seam_does_not_want_are_dropped_and_stock_loads(fake_transformers, sharded):
    def build():  # DeepSpeed turns up after the files were known: the seam decides stock
        fake_transformers.state["zero3"] = True

    fake_transformers.state["build"] = build
    with ft.loading():
        fake_transformers.mu.PreTrainedModel.from_pretrained(sharded)
    report = ft.last_load_report()
    assert report.taken == "stock" and len(stock_safe_open.opened) == 2
    assert report.early.startswith("started before the model was built; dropped unused: ")
    assert "ZeRO-3" in report.early
    assert read_threads() == []


def test_arguments_settled_only_with_the_model_wait_for_the_seam(fake_transformers):
    mu = fake_transformers.mu
    for kwargs, why in [({"tp_plan": "auto"}, "tp_plan= asks for tensor parallelism"),
                        ({"device_mesh": object()}, "device_mesh= asks"),
                        ({"device_map": "auto"}, "device_map='auto' is planned only once"),
                        ({"device_map": {"a": "cpu", "b": "cuda:1"}}, "spans cpu, cuda:1")]:
        device, reason = ft._early_device(kwargs, mu)
        assert device is None and why in reason, kwargs
    assert ft._early_device({}, mu) == ("cpu", "")
    assert ft._early_device({"device_map": 1}, mu) == ("cuda:1", "")
    mu.get_torch_context_manager_or_global_device = lambda: torch.device("cuda", 2)
    assert ft._early_device({}, mu) == ("cuda:2", "")


def test_a_device_map_of_one_device_starts_early(fake_transformers, sharded):
    with ft.loading():
        fake_transformers.mu.PreTrainedModel.from_pretrained(sharded, device_map={"": "cpu"})
    assert ft.last_load_report().early == "started before the model was built"


def test_a_get_dtype_of_another_shape_reads_at_the_seam(fake_transformers, sharded):
    def _get_dtype(dtype, files, config, metadata, state_dict, weights_only, quantizer):
        return config, dtype

    fake_transformers.mu._get_dtype = _get_dtype
    with ft.loading():
        fake_transformers.mu.PreTrainedModel.from_pretrained(sharded)
    report = ft.last_load_report()
    assert report.taken == "ferry" and report.read_started_s is None
    assert report.early.startswith("started when transformers asked, not before: _get_dtype "
                                   "takes (dtype, files, config")


# ------------------------------------------------------------------ tensor parallelism

def tp_weights(seed=0):
    """Sizes no world size of 2 or 4 divides evenly (ceil-sized parts, a short last one)."""
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(1030, 64, generator=g),
            "proj.gamma": torch.randn(701, 64, generator=g).to(torch.bfloat16),
            "proj.bias": torch.randn(701, generator=g),
            "gate_up.weight": torch.randn(2 * 400, 64, generator=g).to(torch.float16),
            "down.weight": torch.randn(64, 403, generator=g),
            "norm.weight": torch.randn(64, generator=g)}


@pytest.fixture
def tp_checkpoint(tmp_path):
    w = tp_weights()
    names = sorted(w)
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {k: w[k] for k in names[:3]})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {k: w[k] for k in names[3:]})
    return str(tmp_path)


class Whole:
    """A lazy slice over a tensor already in memory: the reference cut of a full read."""

    def __init__(self, tensor):
        self.tensor = tensor

    def get_shape(self):
        return list(self.tensor.shape)

    def __getitem__(self, index):
        return self.tensor[index]


def expected_parts(rank, world):
    return {name: tp_part(Whole(t), TP_PLAN[name], rank, world).to(torch.float32)
            for name, t in tp_weights().items()}


def share(parts, dtypes):
    """Bytes of a rank's parts as stored (before the stand-in's cast)."""
    return sum(t.numel() * torch.empty((), dtype=dtypes[name]).element_size()
               for name, t in parts.items())


def test_decide_serves_a_device_mesh_with_per_rank_slices(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"")
    files, cfg = [str(f)], LoadStateDictConfig
    assert ft.decide(None, files, cfg(device_mesh=Mesh(0, 2))) == (ft.SLICES, "")
    for config, why in [(cfg(device_mesh=Mesh(0, 2), hf_quantizer=object()), "quantized"),
                        (cfg(device_mesh=Mesh(0, 2), disable_mmap=True), "disable_mmap")]:
        device, reason = ft.decide(None, files, config)
        assert device is None and why in reason
    device, reason = ft.decide(None, [str(tmp_path / "gone.safetensors")],
                               cfg(device_mesh=Mesh(0, 2)))
    assert device is None and "is not a local file" in reason


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_ranks_read_only_their_parts_and_get_stock_shards(
        fake_transformers, tp_checkpoint, world):
    import ferry
    mu = fake_transformers.mu
    dtypes = {k: t.dtype for k, t in tp_weights().items()}
    whole = sum(t.numel() * t.element_size() for t in tp_weights().values())
    total = 0
    for rank in range(world):
        mesh = Mesh(rank, world)
        stock = mu.PreTrainedModel.from_pretrained(tp_checkpoint, tp_plan="auto",
                                                   device_mesh=mesh).tp_shards
        before = ferry.stats().bytes_read
        with ft.loading():
            served = mu.PreTrainedModel.from_pretrained(tp_checkpoint, tp_plan="auto",
                                                        device_mesh=mesh).tp_shards
        storage = ferry.stats().bytes_read - before
        report = ft.last_load_report()
        want = expected_parts(rank, world)
        assert sorted(served) == sorted(stock) == sorted(want)
        for name in want:
            assert served[name].dtype == stock[name].dtype, name
            assert torch.equal(served[name], stock[name]) and torch.equal(served[name], want[name])
        assert report.taken == "ferry", str(report)
        assert report.device == f"per-rank slices, rank {rank} of {world}"
        assert all(f"rank {rank} of {world}: read by ferry into cpu" in f.reason
                   for f in report.files), str(report)
        assert report.early.startswith("started when transformers asked, not before: tp_plan=")
        mine = share(want, dtypes)
        assert report.bytes == mine, (report.bytes, mine)
        assert storage <= 1.1 * mine + 2 * 4096, (storage, mine)
        total += report.bytes
    replicated = tp_weights()["norm.weight"].numel() * 4
    assert total - world * replicated <= 1.01 * (whole - replicated)


def test_a_tensor_parallel_file_ferry_cannot_slice_is_read_by_stock(fake_transformers, tmp_path,
                                                                     monkeypatch):
    monkeypatch.setattr(ft, "_PACKED", ("BF16",))  # as if BF16 were a packed sub-byte type
    w = tp_weights()
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors",
                      {"proj.gamma": w["proj.gamma"]})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors",
                      {k: w[k] for k in w if k != "proj.gamma"})
    with ft.loading():
        shards = fake_transformers.mu.PreTrainedModel.from_pretrained(
            str(tmp_path), tp_plan="auto", device_mesh=Mesh(1, 2)).tp_shards
    want = expected_parts(1, 2)
    assert all(torch.equal(shards[k], want[k]) for k in want)
    report = ft.last_load_report()
    assert report.taken == "mixed"
    first, second = report.files
    assert first.taken == "stock" and "'proj.gamma' is BF16" in first.reason
    assert second.taken == "ferry" and "rank 1 of 2" in second.reason


# The gloo test's rank: the stand-in's tensor-parallel load, stock's and ferry's, at once on
# every rank (each its own process, as torchrun starts them).
TP_WORKER = r'''
import datetime, os, pickle, sys
sys.path.insert(0, sys.argv[3])
import torch, torch.distributed as dist
import ferry, ferry.transformers as ft
import test_transformers as tt

out_dir, path = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
mu, _ = tt.stand_in(lambda d, k, v: d.__setitem__(k, v))
mesh = tt.Mesh(rank, world)
stock = mu.PreTrainedModel.from_pretrained(path, tp_plan="auto", device_mesh=mesh).tp_shards
dist.barrier()
before = ferry.stats().bytes_read
with ft.loading():
    served = mu.PreTrainedModel.from_pretrained(path, tp_plan="auto", device_mesh=mesh).tp_shards
storage = ferry.stats().bytes_read - before
read = torch.tensor([ft.last_load_report().bytes])
dist.all_reduce(read)  # the group's bytes, as each rank sees them
with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
    pickle.dump({"stock": stock, "ferry": served, "storage": storage, "group": int(read),
                 "report": ft.last_load_report().to_dict()}, f)
dist.destroy_process_group()
'''


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_ranks_load_their_tensor_parallel_shards_through_slices(tp_checkpoint, tmp_path,
                                                                     world):
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip(f"torch {torch.__version__} has no gloo backend")
    from test_distributed import launch
    here = os.path.dirname(os.path.abspath(__file__))
    results = launch(tmp_path, world, [tp_checkpoint, here], worker=TP_WORKER)
    dtypes = {k: t.dtype for k, t in tp_weights().items()}
    shares = []
    for rank, got in enumerate(results):
        want = expected_parts(rank, world)
        for name in want:
            assert torch.equal(got["ferry"][name], got["stock"][name]), (rank, name)
            assert torch.equal(got["ferry"][name], want[name]), (rank, name)
        shares.append(share(want, dtypes))
        assert got["report"]["bytes"] == shares[-1]
        assert got["storage"] <= 1.1 * shares[-1] + 2 * 4096, (rank, got["storage"], shares[-1])
    assert all(got["group"] == sum(shares) for got in results)


def test_safetensors_slices_read_only_the_box_of_each_index_form(tp_checkpoint):
    """ferry.safetensors' get_slice, the same reads: every index form tensor parallelism uses
    gives torch's answer and reads (ferry's count of storage bytes) only its box."""
    import ferry
    from ferry.safetensors import safe_open
    t = tp_weights()["down.weight"]  # (64, 403) float32
    forms = [(slice(8, 24),), (slice(None), slice(101, 202)), (Ellipsis, slice(300, None)),
             ([3, 4, 5, 40, 41],), (slice(None), [0, 1, 200, 201]), (2, slice(5, 9)),
             (None, slice(0, 2)), (slice(60, 99),), (Ellipsis,), (), (True,)]
    with safe_open(os.path.join(tp_checkpoint, "model-00001-of-00002.safetensors"), "pt") as f:
        for index in forms + [(Ellipsis, slice(0, 9, 2))]:
            before = ferry.stats().bytes_read
            got = f.get_slice("down.weight")[index]
            read = ferry.stats().bytes_read - before
            want = t[index]
            assert got.shape == want.shape and torch.equal(got, want), index
            box = want.numel() * 4 if index in forms else 64 * 9 * 4  # a step reads its span
            assert box <= read <= 1.1 * box + 4096, (index, read, box)
        with pytest.raises(ValueError):  # a negative step: torch's own error, as on a tensor
            f.get_slice("down.weight")[::-1]


def test_a_tensor_parallel_file_opened_for_a_device_ferry_cannot_fill_is_read_by_stock(
        fake_transformers, tp_checkpoint):
    fake_transformers.state["open_on"] = "mps"
    with ft.loading():
        shards = fake_transformers.mu.PreTrainedModel.from_pretrained(
            tp_checkpoint, tp_plan="auto", device_mesh=Mesh(0, 2)).tp_shards
    want = expected_parts(0, 2)
    assert all(torch.equal(shards[k], want[k]) for k in want)
    report = ft.last_load_report()
    assert report.taken == "stock" and len(stock_safe_open.opened) == 2
    assert all("on another device: device mps: ferry reads into host or CUDA memory only"
               in f.reason for f in report.files), str(report)
