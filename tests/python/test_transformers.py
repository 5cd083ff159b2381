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
                    pointer = mu.safe_open(file, framework="pt", device="cpu", backend="mmap")
                    pointers.append(pointer)
                    for k in pointer.keys():
                        merged[k] = pointer.get_slice(k)
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
        def from_pretrained(cls, path, device_map=None, dtype=torch.float32):
            files = sorted(os.path.join(path, f) for f in os.listdir(path)
                           if f.endswith((".safetensors", ".bin")))
            _, dtype = mu._get_dtype(dtype, files, None, None, None, True, None)
            state["build"]()  # transformers builds the model (and imports lazily) here
            model = TinyModel()
            if isinstance(device_map, str):
                device_map = {"": device_map}
            config = LoadStateDictConfig(device_map=device_map, dtype=dtype)
            cls._load_pretrained_model(model, None, files, config)
            return model

    mu.PreTrainedModel = PreTrainedModel
    return mu


@pytest.fixture
def fake_transformers(monkeypatch):
    """A stand-in transformers package in sys.modules; the test fails if ferry's patch is
    still installed when it ends."""
    state = {"zero3": False, "warmups": [], "build": lambda: None}
    package = types.ModuleType("transformers")
    package.__version__ = "5.0.stand-in"
    mu = make_modeling_utils(state)
    package.modeling_utils = mu
    monkeypatch.setitem(sys.modules, "transformers", package)
    monkeypatch.setitem(sys.modules, "transformers.modeling_utils", mu)
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
        (dict(state_dict=None, checkpoint_files=files, load_config=cfg(device_mesh=object())),
         "tensor parallelism"),
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
