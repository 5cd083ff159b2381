"""ferry.transformers against the real transformers 5 and sentence-transformers on a GPU: tiny
models of four families (Qwen2 with tied embeddings and biases, Mixtral's mixture of experts
whose experts transformers fuses as it loads, BERT with legacy LayerNorm.gamma/beta names and a
missing pooler to initialise, GPT-2 with tied embeddings), built from configs and saved in
several shards, then loaded by stock from_pretrained and through ferry: every tensor, buffer,
tie, dtype, device and the logits must be the same; so must every model of the committed zoo
(tests/data/zoo), and the reads must have started before the model was built. Skips, with the
reason, without transformers or a CUDA GPU. Run on the GPU machine:

    PYTHONPATH=$PWD/python python3 -m pytest -q -rs tests/python/test_transformers_gpu.py
"""

from __future__ import annotations

import os
import threading

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA GPU", allow_module_level=True)

import ferry.transformers as ft  # noqa: E402

pytestmark = pytest.mark.gpu

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4)


def build(family):
    """(model class, Auto class, model) of one family, randomly initialised, in bf16."""
    torch.manual_seed(1234)
    if family == "qwen2":
        config = transformers.Qwen2Config(**TINY, num_key_value_heads=2, tie_word_embeddings=True)
        cls, auto = transformers.Qwen2ForCausalLM, transformers.AutoModelForCausalLM
    elif family == "mixtral":
        config = transformers.MixtralConfig(**TINY, num_key_value_heads=2, num_local_experts=4,
                                            num_experts_per_tok=2)
        cls, auto = transformers.MixtralForCausalLM, transformers.AutoModelForCausalLM
    elif family == "bert":
        config = transformers.BertConfig(**TINY)
        cls, auto = transformers.BertModel, transformers.AutoModel
    elif family == "gpt2":
        config = transformers.GPT2Config(vocab_size=512, n_embd=64, n_layer=2, n_head=4,
                                         n_positions=64)
        cls, auto = transformers.GPT2LMHeadModel, transformers.AutoModelForCausalLM
    else:
        raise ValueError(family)
    model = cls(config).to(torch.bfloat16)
    return cls, auto, model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> directory of a sharded bf16 checkpoint (BERT's rewritten with legacy names and
    without its pooler)."""
    out = {}
    for family in ("qwen2", "mixtral", "bert", "gpt2"):
        path = tmp_path_factory.mktemp(family)
        _, _, model = build(family)
        model.save_pretrained(path, max_shard_size="100KB")
        shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        assert len(shards) >= 2, shards
        if family == "bert":
            legacy_bert(path, shards)
        out[family] = str(path)
    return out


def legacy_bert(path, shards):
    """Rewrites a saved BERT as an old checkpoint: LayerNorm.gamma/beta, no pooler (so that
    transformers renames keys and initialises missing weights); the index follows."""
    import json
    from safetensors.torch import load_file, save_file
    weight_map = {}
    for shard in shards:
        tensors = load_file(path / shard)
        renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma")
                   .replace("LayerNorm.bias", "LayerNorm.beta"): v
                   for k, v in tensors.items() if not k.startswith("pooler.")}
        if not renamed:
            os.remove(path / shard)
            continue
        save_file(renamed, path / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(renamed, shard))
    index = path / "model.safetensors.index.json"
    meta = json.loads(index.read_text())
    meta["weight_map"] = weight_map
    index.write_text(json.dumps(meta))


def load_both(cls, path, **kwargs):
    """(stock model, ferry's model, ferry's report), each load seeded alike so that missing
    weights are initialised alike."""
    torch.manual_seed(0)
    stock = cls.from_pretrained(path, **kwargs)
    torch.manual_seed(0)
    with ft.loading():
        mine = cls.from_pretrained(path, **kwargs)
    return stock, mine, ft.last_load_report()


def ties(model):
    """Groups of parameter and buffer names that share storage."""
    groups = {}
    for name, t in list(model.named_parameters(remove_duplicate=False)) + \
            list(model.named_buffers(remove_duplicate=False)):
        groups.setdefault(t.data_ptr(), set()).add(name)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def assert_identical(stock, mine, device, dtype):
    s_state, m_state = stock.state_dict(), mine.state_dict()
    assert list(s_state) == list(m_state)
    for name, s in s_state.items():
        m = m_state[name]
        assert (m.dtype, m.device, m.shape) == (s.dtype, s.device, s.shape), name
        assert torch.equal(m, s), name
    s_buffers, m_buffers = dict(stock.named_buffers()), dict(mine.named_buffers())
    assert list(s_buffers) == list(m_buffers)  # non-persistent ones too
    for name, s in s_buffers.items():
        assert torch.equal(m_buffers[name], s), name
    assert ties(mine) == ties(stock)
    for (name, s), (_, m) in zip(stock.named_parameters(), mine.named_parameters()):
        assert m.requires_grad == s.requires_grad, name
    floats = {p.dtype for p in mine.parameters() if p.is_floating_point()}
    assert dtype in floats
    assert {str(p.device) for p in mine.parameters()} == {device}
    assert mine.training is stock.training is False
    ids = (torch.arange(24, device=device) * 7 % 500).reshape(2, 12)
    extra = {"decoder_input_ids": ids} if stock.config.is_encoder_decoder else {}
    with torch.no_grad():
        s_out, m_out = stock(input_ids=ids, **extra), mine(input_ids=ids, **extra)
    key = "logits" if hasattr(s_out, "logits") else "last_hidden_state"
    assert torch.equal(getattr(m_out, key), getattr(s_out, key))


@pytest.mark.parametrize("device_map", ["cuda:0", "cpu"])
@pytest.mark.parametrize("family", ["qwen2", "mixtral", "bert", "gpt2"])
def test_from_pretrained_through_ferry_equals_stock(checkpoints, family, device_map):
    cls, auto, _ = build(family)
    stock, mine, report = load_both(auto, checkpoints[family], device_map=device_map,
                                    dtype=torch.bfloat16)
    assert type(mine) is cls
    assert report.taken == "ferry" and report.device == device_map, str(report)
    assert len(report.files) >= 2 and all(f.route for f in report.files)
    assert report.early == "started before the model was built", str(report)
    assert report.read_started_s < report.model_built_s, str(report)
    assert_identical(stock, mine, device_map, torch.bfloat16)


ZOO = os.path.join(os.path.dirname(__file__), "..", "data", "zoo")
ZOO_FAMILIES = sorted(f for f in os.listdir(ZOO) if os.path.isfile(os.path.join(ZOO, f,
                                                                                 "config.json")))


@pytest.mark.parametrize("device_map", ["cuda:0", "cpu"])
@pytest.mark.parametrize("family", ZOO_FAMILIES)
def test_the_committed_zoo_loads_through_ferry_as_stock_loads_it(family, device_map):
    """Every model of tests/data/zoo (bench/model_zoo.py: tied embeddings, biases, experts,
    float16/float32/bfloat16), in the dtype its config names, read early."""
    path = os.path.join(ZOO, family)
    config = transformers.AutoConfig.from_pretrained(path)
    cls = getattr(transformers, config.architectures[0])
    stock, mine, report = load_both(cls, path, device_map=device_map, dtype="auto")
    assert report.taken == "ferry" and report.device == device_map, str(report)
    assert report.early == "started before the model was built", str(report)
    assert_identical(stock, mine, device_map, stock.dtype)


def test_from_pretrained_raising_after_the_reads_began_frees_the_gpu(checkpoints):
    cls, _, _ = build("qwen2")

    class Broken(cls):
        def __init__(self, *args, **kwargs):
            raise RuntimeError("the model's __init__ failed")

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with ft.loading():
        with pytest.raises(RuntimeError, match="__init__ failed"):
            Broken.from_pretrained(checkpoints["qwen2"], device_map="cuda:0")
    assert torch.cuda.memory_allocated() == before
    assert not [t for t in threading.enumerate() if t.name == "ferry-hf-read"]
    assert "dropped: from_pretrained ended before it took the tensors" in \
        ft.last_load_report().early


def test_device_map_auto_reads_when_transformers_has_placed_the_model(checkpoints):
    cls, _, _ = build("gpt2")
    stock, mine, report = load_both(cls, checkpoints["gpt2"], device_map="auto")
    assert report.taken == "ferry", str(report)
    assert "device_map='auto' is planned only once the model is built" in report.early
    assert_identical(stock, mine, str(next(stock.parameters()).device), stock.dtype)


def test_a_quantized_load_stays_stock_and_says_so(checkpoints):
    pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")
    cls, _, _ = build("qwen2")
    quantization = transformers.BitsAndBytesConfig(load_in_8bit=True)
    with ft.loading():
        cls.from_pretrained(checkpoints["qwen2"], device_map="cuda:0",
                            quantization_config=quantization)
    report = ft.last_load_report()
    assert report.taken == "stock" and "quantized model" in report.early, str(report)


@pytest.mark.parametrize("family", ["qwen2", "bert"])
def test_dtype_asked_is_cast_by_transformers_after_ferry_reads(checkpoints, family):
    cls, _, _ = build(family)
    stock, mine, report = load_both(cls, checkpoints[family], device_map="cuda:0",
                                    torch_dtype=torch.float32)
    assert report.taken == "ferry"
    assert_identical(stock, mine, "cuda:0", torch.float32)


def test_qwen2_stays_tied_and_default_device_map_loads_on_the_host(checkpoints):
    stock, mine, report = load_both(transformers.AutoModelForCausalLM, checkpoints["qwen2"])
    assert report.taken == "ferry" and report.device == "cpu"
    assert mine.lm_head.weight.data_ptr() == mine.model.embed_tokens.weight.data_ptr()
    assert_identical(stock, mine, "cpu", stock.dtype)


def test_device_map_across_devices_loads_stock_with_the_reason(checkpoints):
    cls, _, _ = build("gpt2")
    device_map = {"transformer.wte": 0, "transformer.wpe": 0, "transformer.drop": 0,
                  "transformer.h": "cpu", "transformer.ln_f": 0, "lm_head": 0}
    with ft.loading():
        cls.from_pretrained(checkpoints["gpt2"], device_map=device_map)
    report = ft.last_load_report()
    assert report.taken == "stock"
    assert all("device_map spans cpu, cuda:0" in f.reason for f in report.files)
    assert "not before: device_map spans cpu, cuda:0" in report.early, str(report)


def test_function_form_reads_through_ferry(checkpoints):
    model = ft.from_pretrained(transformers.AutoModel, checkpoints["bert"], device_map="cuda:0")
    assert type(model).__name__ == "BertModel"
    assert ft.last_load_report().taken == "ferry" and not ft.is_enabled()


@pytest.mark.parametrize("model_kwargs,read_into", [(None, "cpu"),
                                                    ({"device_map": "cuda"}, "cuda:0")])
def test_sentence_transformers_loads_its_bert_through_ferry(tmp_path, model_kwargs, read_into):
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is absent")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ferry", "reads", "weights", "fast"]
    tokenizer = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(words)})
    path = tmp_path / "st"
    _, _, model = build("bert")
    model.save_pretrained(path, max_shard_size="100KB")
    tokenizer.save_pretrained(path)
    sentences = ["ferry reads weights fast", "weights"]
    torch.manual_seed(0)
    stock = st.SentenceTransformer(str(path), device="cuda", model_kwargs=model_kwargs)
    torch.manual_seed(0)
    with ft.loading():
        mine = st.SentenceTransformer(str(path), device="cuda", model_kwargs=model_kwargs)
    report = ft.last_load_report()
    assert report is not None and report.taken == "ferry", str(report)
    assert report.device == read_into
    assert torch.equal(mine.encode(sentences, convert_to_tensor=True),
                       stock.encode(sentences, convert_to_tensor=True))
