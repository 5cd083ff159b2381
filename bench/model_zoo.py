"""A zoo of real checkpoints, checked through every ferry entry point against safetensors.

Models are built from transformers configs (no hub: nothing is downloaded) and saved by
transformers' own ``save_pretrained``, as users' checkpoints are; one more file is written by
``safetensors.torch.save_file`` with every dtype torch has, zero-size and scalar tensors and
metadata. Then every way into ferry loads them and each tensor is compared with what
safetensors reads (name set, dtype, shape, bytes):

    python bench/model_zoo.py make   --dir D [--big]        # tiny members (+ the >= 4 GiB ones)
    python bench/model_zoo.py check  --dir D --cli ferry [--device cuda:0] [--json out.jsonl]
    python bench/model_zoo.py bench  --dir D --cli ferry [--rounds 3] [--json out.jsonl]
    python bench/model_zoo.py digests --dir D/tiny -o tests/data/zoo/digests.json

``make`` needs transformers, safetensors and torch (the GPU machine); ``check`` and ``bench``
need safetensors too. ``digests`` records safetensors' view of the tiny members (per tensor:
dtype, shape, SHA-256 of the bytes) so that CI, which has neither transformers nor safetensors,
checks ferry's host-memory entry points against it (tests/python/test_zoo.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import zlib
from typing import Any, Callable, Dict, List, Tuple

# family -> (config class, model class, config arguments, dtype, what it exercises). Tiny sizes:
# the whole tiny zoo is a few MB, each member still several shards (max_shard_size below).
TINY = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1000),
              "bfloat16", "rotary buffers, GQA"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                   tie_word_embeddings=True),
              "bfloat16", "tied embeddings, q/k/v biases"),
    "mistral": ("MistralConfig", "MistralForCausalLM",
                dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=1000),
                "bfloat16", "no biases, small norms"),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=128),
             "float32", "Conv1D weights, float32, tied head"),
    "bert": ("BertConfig", "BertModel",
             dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, vocab_size=1000, max_position_embeddings=128),
             "float32", "encoder, pooler, int64 buffers where saved"),
    "t5": ("T5Config", "T5ForConditionalGeneration",
           dict(d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=16,
                vocab_size=1000),
           "float32", "encoder/decoder sharing one embedding"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                     num_local_experts=8, num_experts_per_tok=2),
                "bfloat16", "mixture of experts: many small tensors"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM",
              dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=1000),
              "bfloat16", "tied embeddings, MQA"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                       shared_expert_intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                       num_experts=8, num_experts_per_tok=2),
                  "bfloat16", "experts and a shared expert"),
    "phi": ("PhiConfig", "PhiForCausalLM",
            dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, vocab_size=1000),
            "float16", "partial rotary, dense biases, float16"),
}
TINY_SHARD = "150KB"

# The members of at least 4 GiB, for the speed table (issue 29): a Qwen2-family model as the
# issue describes it (4.03 GiB, 5 shards), and a Mistral-family 7 B one (13.5 GiB, 3 shards).
BIG = {
    "qwen2-4g": ("Qwen2Config", "Qwen2ForCausalLM",
                 dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=24,
                      num_attention_heads=16, num_key_value_heads=2, vocab_size=151936,
                      tie_word_embeddings=True),
                 "bfloat16", "1GB"),
    "mistral-13g": ("MistralConfig", "MistralForCausalLM",
                   dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000),
                   "bfloat16", "5GB"),
}


def log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------- make


def make_model(family: str, spec: Tuple[Any, ...], out: str, shard: str, on_gpu: bool) -> str:
    import torch
    import transformers
    config_cls, model_cls, kwargs, dtype, _ = spec[:5]
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(zlib.crc32(family.encode()))
    device = "cuda" if on_gpu and torch.cuda.is_available() else "cpu"
    dt = getattr(torch, dtype)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dt)  # built in its dtype (on the GPU for the big ones): no fp32 copy
    try:
        with torch.device(device):
            model = getattr(transformers, model_cls)(config)
    finally:
        torch.set_default_dtype(default)
    # Weights initialised to zero or one (norms, biases) are replaced by random values, so that
    # a tensor read from the wrong place cannot match by chance.
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.5, 0.5)
    model.save_pretrained(out, max_shard_size=shard)
    del model
    return out


def make_dtypes(out: str) -> str:
    """One file by safetensors.torch.save_file: every dtype this torch has, zero-size and scalar
    tensors, metadata."""
    import torch
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    g = torch.Generator().manual_seed(29)
    tensors: Dict[str, Any] = {}
    names = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
             "float64", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"]
    for i, name in enumerate(names):
        dt = getattr(torch, name, None)
        if dt is None:
            continue
        raw = torch.randint(0, 256, (3, 5, 8 * 8), dtype=torch.uint8, generator=g)
        if name == "bool":
            tensors[f"t.{name}"] = (raw & 1).bool()[..., :8].contiguous()
            continue
        size = torch.empty((), dtype=dt).element_size()
        t = raw.view(-1)[: 3 * 5 * 8 * size].view(dt).reshape(3, 5, 8)
        if dt.is_floating_point:  # no NaN payloads: safetensors and ferry agree on bytes anyway
            t = torch.nan_to_num(t.float()).clamp(-100, 100).to(dt)
        tensors[f"t.{name}"] = t.contiguous()
    tensors["scalar.f32"] = torch.tensor(3.25)
    tensors["scalar.i64"] = torch.tensor(-7, dtype=torch.int64)
    tensors["empty.bf16"] = torch.empty((0, 4), dtype=torch.bfloat16)
    tensors["empty.f32"] = torch.empty((5, 0, 2), dtype=torch.float32)
    path = os.path.join(out, "model.safetensors")
    save_file(tensors, path, metadata={"format": "pt", "made_by": "bench/model_zoo.py"})
    return path


def cmd_make(args: argparse.Namespace) -> None:
    made = []
    tiny = os.path.join(args.dir, "tiny")
    for family, spec in TINY.items():
        out = os.path.join(tiny, family)
        try:
            make_model(family, spec, out, TINY_SHARD, on_gpu=False)
            made.append(out)
        except Exception as e:  # a family this transformers lacks: say so, go on
            log(f"make {family}: skipped: {type(e).__name__}: {e}")
    made.append(os.path.dirname(make_dtypes(os.path.join(tiny, "dtypes"))))
    if args.big:
        for name, spec in BIG.items():
            out = os.path.join(args.dir, "big", name)
            if os.path.exists(os.path.join(out, "model.safetensors.index.json")):
                made.append(out)
                continue
            t0 = time.perf_counter()
            make_model(name, spec + ("",), out, spec[4], on_gpu=True)
            log(f"make {name}: {time.perf_counter() - t0:.1f} s")
            made.append(out)
    for m in made:
        files = [f for f in os.listdir(m) if f.endswith(".safetensors")]
        size = sum(os.path.getsize(os.path.join(m, f)) for f in files)
        log(f"made {m}: {len(files)} shard(s), {size / 2**20:.2f} MiB")


# --------------------------------------------------------------------------------- reference


def shard_files(member: str) -> List[str]:
    return sorted(os.path.join(member, f) for f in os.listdir(member)
                  if f.endswith(".safetensors"))


def tensor_bytes(t: Any) -> bytes:
    """The bytes of a torch tensor as stored (any dtype, any device)."""
    import torch
    t = t.detach().contiguous().reshape(-1)
    if t.numel() == 0:
        return b""
    return t.view(torch.uint8).cpu().numpy().tobytes()


def reference(member: str) -> Dict[str, Any]:
    """safetensors' view of a member: per tensor dtype, shape and SHA-256 of its bytes; per shard
    its metadata."""
    from safetensors import safe_open as st_open
    tensors: Dict[str, Any] = {}
    metadata: Dict[str, Any] = {}
    for path in shard_files(member):
        with open(path, "rb") as raw:  # the dtype as the file names it
            header = json.loads(raw.read(int.from_bytes(raw.read(8), "little")))
        with st_open(path, framework="pt", device="cpu") as f:
            metadata[os.path.basename(path)] = f.metadata()
            for name in f.keys():
                t = f.get_tensor(name)
                tensors[name] = {"dtype": header[name]["dtype"],
                                 "shape": list(t.shape),
                                 "sha256": hashlib.sha256(tensor_bytes(t)).hexdigest(),
                                 "nbytes": t.numel() * t.element_size(),
                                 "shard": os.path.basename(path)}
    return {"tensors": tensors, "metadata": metadata}


def cmd_digests(args: argparse.Namespace) -> None:
    out: Dict[str, Any] = {}
    for member in sorted(os.listdir(args.dir)):
        path = os.path.join(args.dir, member)
        if os.path.isdir(path):
            out[member] = reference(path)
    with open(args.output, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    log(f"digests of {len(out)} member(s) -> {args.output}")


# --------------------------------------------------------------------------------- check

SAFETENSORS_OF_TORCH = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
    "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64", "uint16": "U16",
    "uint32": "U32", "uint64": "U64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "complex64": "C64",
}
NUMPY_OF_SAFETENSORS = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "F16": "float16",
    "BF16": "uint16", "U32": "uint32", "I32": "int32", "F32": "float32", "U64": "uint64",
    "I64": "int64", "F64": "float64", "F8_E4M3": "uint8", "F8_E5M2": "uint8", "C64": "complex64",
}


def compare_torch(ref: Dict[str, Any], got: Dict[str, Any], device: str) -> List[str]:
    """Differences between safetensors' reference and a {name: torch tensor} load."""
    bad = []
    if set(got) != set(ref):
        bad.append(f"names: missing {sorted(set(ref) - set(got))[:3]}, "
                   f"extra {sorted(set(got) - set(ref))[:3]}")
    for name, r in ref.items():
        t = got.get(name)
        if t is None:
            continue
        kind = SAFETENSORS_OF_TORCH.get(str(t.dtype).rsplit(".", 1)[-1])
        if kind != r["dtype"]:
            bad.append(f"{name}: dtype {t.dtype}, safetensors {r['dtype']}")
        if list(t.shape) != r["shape"]:
            bad.append(f"{name}: shape {list(t.shape)}, safetensors {r['shape']}")
        if device != "any" and t.device.type != device.split(":")[0]:
            bad.append(f"{name}: on {t.device}, asked {device}")
        if hashlib.sha256(tensor_bytes(t)).hexdigest() != r["sha256"]:
            bad.append(f"{name}: bytes differ")
    return bad


def compare_numpy(ref: Dict[str, Any], got: Dict[str, Any]) -> List[str]:
    bad = []
    if set(got) != set(ref):
        bad.append(f"names: missing {sorted(set(ref) - set(got))[:3]}, "
                   f"extra {sorted(set(got) - set(ref))[:3]}")
    for name, r in ref.items():
        a = got.get(name)
        if a is None:
            continue
        if str(a.dtype) != NUMPY_OF_SAFETENSORS.get(r["dtype"], "?"):
            bad.append(f"{name}: dtype {a.dtype} for {r['dtype']}")
        if list(a.shape) != r["shape"]:
            bad.append(f"{name}: shape {list(a.shape)}, safetensors {r['shape']}")
        if hashlib.sha256(a.tobytes()).hexdigest() != r["sha256"]:
            bad.append(f"{name}: bytes differ")
    return bad


def compare_cli(ref: Dict[str, Any], report: Dict[str, Any], names: Any = None) -> List[str]:
    want = {n: r for n, r in ref.items() if names is None or n in names}
    got = {t["name"]: t for t in report.get("tensor_list", [])}
    bad = []
    if set(got) != set(want):
        bad.append(f"names: missing {sorted(set(want) - set(got))[:3]}, "
                   f"extra {sorted(set(got) - set(want))[:3]}")
    for name, r in want.items():
        t = got.get(name)
        if t is None:
            continue
        if t["dtype"] != r["dtype"] or list(t["shape"]) != r["shape"]:
            bad.append(f"{name}: {t['dtype']} {t['shape']}, safetensors {r['dtype']} {r['shape']}")
        if t.get("sha256") != r["sha256"]:
            bad.append(f"{name}: bytes differ")
    return bad


def run_cli(cli: str, member: str, *flags: str) -> Dict[str, Any]:
    out = subprocess.run([cli, "load", member, "--checksum", "--json", *flags],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip() or f"exit {out.returncode}")
    return json.loads(out.stdout)


def slice_checks(member: str, ref: Dict[str, Any], device: str) -> List[str]:
    """safe_open's get_slice (steps, negative indices), keys and metadata, against the tensor
    safetensors reads, sliced by torch."""
    import torch
    from safetensors import safe_open as st_open
    import ferry.safetensors as fs
    bad = []
    for path in shard_files(member):
        with st_open(path, framework="pt", device="cpu") as s, \
                fs.safe_open(path, framework="pt", device=device) as f:
            if sorted(f.keys()) != sorted(s.keys()):
                bad.append(f"{os.path.basename(path)}: keys differ")
            if (f.metadata() or None) != (s.metadata() or None):
                bad.append(f"{os.path.basename(path)}: metadata {f.metadata()} vs {s.metadata()}")
            for name in list(s.keys())[:6]:
                full = s.get_tensor(name)
                if full.dim() == 0 or full.numel() == 0:
                    continue
                cases = [(slice(None, None, 2),), (slice(-2, None),), (-1,)]
                if full.dim() >= 2:
                    cases += [(slice(None), slice(1, None, 3)), (slice(-3, -1), slice(None, -1))]
                for index in cases:
                    try:  # safetensors' own slice where it takes the index, else torch's
                        want = s.get_slice(name)[index]
                    except Exception:
                        want = full[index]
                    try:
                        got = f.get_slice(name)[index]
                    except Exception as e:
                        bad.append(f"{name}{index}: {type(e).__name__}: {e}")
                        continue
                    if got.dtype != want.dtype or list(got.shape) != list(want.shape) or \
                            not torch.equal(got.cpu(), want):
                        bad.append(f"{name}{index}: differs")
                if not torch.equal(f.get_tensor(name).cpu(), full):
                    bad.append(f"{name}: get_tensor differs")
    return bad


def distributed_one_rank(member: str, device: str) -> Dict[str, Any]:
    import torch.distributed as dist
    import ferry.distributed
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        backend = "nccl" if device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, rank=0, world_size=1)
    return ferry.distributed.load_checkpoint(member, device=device)


def entry_points(member: str, cli: str,
                 device: str) -> List[Tuple[str, str, Callable[[], Any]]]:
    """(entry point, memory, a function returning its differences) for one member and device
    ("cpu" or "cuda:N"; one per process, as the one-rank process group is)."""
    import ferry
    from ferry.safetensors.numpy import load_file as np_load
    from ferry.safetensors.torch import load_file as pt_load
    ref_cache: Dict[str, Any] = {}

    def ref() -> Dict[str, Any]:
        if not ref_cache:
            ref_cache.update(reference(member)["tensors"])
        return ref_cache

    def first_names(k: int) -> List[str]:
        return sorted(ref())[:k]

    cases = []
    for dev in [device]:
        mem = "gpu" if dev != "cpu" else "host"
        cases += [
            ("ferry.load_checkpoint", mem,
             lambda d=dev: compare_torch(ref(), ferry.load_checkpoint(member, device=d), d)),
            ("ferry.load_checkpoint one_allocation", mem,
             lambda d=dev: compare_torch(ref(), ferry.load_checkpoint(
                 member, device=d, one_allocation=True), d)),
            ("ferry.safetensors.torch.load_file", mem,
             lambda d=dev: compare_torch(ref(), merged(pt_load(p, device=d)
                                                       for p in shard_files(member)), d)),
            ("safe_open get_slice/keys/metadata", mem, lambda d=dev: slice_checks(member, ref(), d)),
            ("ferry.distributed.load_checkpoint (1 rank)", mem,
             lambda d=dev: compare_torch(ref(), distributed_one_rank(member, d), d)),
            (f"ferry load --{'gpu 0' if dev != 'cpu' else 'host'}", mem,
             lambda d=dev: compare_cli(ref(), run_cli(cli, member, *where(d)))),
            ("ferry load --one-allocation", mem,
             lambda d=dev: compare_cli(ref(), run_cli(cli, member, *where(d),
                                                      "--one-allocation"))),
            ("ferry load --tensor", mem,
             lambda d=dev: compare_cli(ref(), run_cli(
                 cli, member, *where(d), *sum((["--tensor", n] for n in first_names(3)), [])),
                 set(first_names(3)))),
        ]
    if device == "cpu":
        cases.append(("ferry.safetensors.numpy.load_file", "host",
                      lambda: compare_numpy(ref(), merged(np_load(p)
                                                          for p in shard_files(member)))))
    return cases


def where(device: str) -> List[str]:
    return ["--host"] if device == "cpu" else ["--gpu", device.split(":")[1]]


def merged(dicts: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for d in dicts:
        out.update(d)
    return out


def members(root: str) -> List[str]:
    found = []
    for sub in ("tiny", "big"):
        base = os.path.join(root, sub)
        if os.path.isdir(base):
            found += [os.path.join(base, m) for m in sorted(os.listdir(base))]
    return found


def cmd_check(args: argparse.Namespace) -> int:
    rows = []
    failures = 0
    for member in members(args.dir):
        if "/big/" in member and not args.big:
            continue
        big = "/big/" in member
        for name, mem, check in entry_points(member, args.cli, args.device):
            # The big members: the two loads the speed table is about (each check reads and
            # hashes the whole checkpoint: seconds per GiB).
            if big and name not in ("ferry.load_checkpoint", "ferry load --gpu 0"):
                continue
            t0 = time.perf_counter()
            try:
                bad = check()
            except Exception as e:
                bad = [f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"]
            row = {"member": os.path.relpath(member, args.dir), "entry": name, "memory": mem,
                   "equal": not bad, "seconds": round(time.perf_counter() - t0, 3),
                   "problems": bad[:5]}
            rows.append(row)
            failures += 0 if not bad else 1
            print(f"{row['member']:<18} {name:<44} {mem:<5} "
                  f"{'equal' if not bad else 'DIFFERS: ' + '; '.join(bad[:2])}", flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    print(f"zoo check: {len(rows) - failures} passed, {failures} failed")
    return 1 if failures else 0


# --------------------------------------------------------------------------------- bench

# Each case runs in a fresh process: CUDA initialised before any clock starts; then the loader's
# imports, timed apart ("import_seconds": what a process pays once); then one load of the whole
# checkpoint into GPU 0, timed until every byte has landed ("seconds", the GB/s reported).
LOADERS = {
    "safetensors.torch.load_file": ("from safetensors.torch import load_file", """
t = {}
for p in files:
    t.update(load_file(p, device="cuda:0"))
"""),
    "ferry.load_checkpoint": ("import ferry", """
t = ferry.load_checkpoint(member, device="cuda:0")
"""),
    "ferry.safetensors.torch.load_file": ("from ferry.safetensors.torch import load_file", """
t = load_file(member, device="cuda:0")
"""),
}
PRELUDE = """
import json, os, sys, time, torch
member = sys.argv[1]
files = sorted(os.path.join(member, f) for f in os.listdir(member) if f.endswith('.safetensors'))
torch.zeros(1, device='cuda:0'); torch.cuda.synchronize()
t_import = time.perf_counter()
"""
START = """
t0 = time.perf_counter()
"""
CODA = """
torch.cuda.synchronize()
seconds = time.perf_counter() - t0
nbytes = sum(v.numel() * v.element_size() for v in t.values())
print(json.dumps({"bytes": nbytes, "seconds": seconds, "import_seconds": t0 - t_import,
                  "tensors": len(t)}))
"""


def page_in(member: str) -> None:
    for path in shard_files(member):
        with open(path, "rb") as f:
            while f.read(64 << 20):
                pass


def one_load(case: str, member: str, cli: str) -> Dict[str, Any]:
    if case == "ferry load --gpu 0":
        t0 = time.perf_counter()
        out = subprocess.run([cli, "load", member, "--gpu", "0", "--json"], capture_output=True,
                             text=True, check=True)
        r = json.loads(out.stdout)
        return {"bytes": r["bytes"], "seconds": r["seconds"], "tensors": r["tensors"],
                "process_seconds": time.perf_counter() - t0}
    imports, load = LOADERS[case]
    code = PRELUDE + imports + START + load + CODA
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, member], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr else "failed")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["process_seconds"] = time.perf_counter() - t0
    return r


def cmd_bench(args: argparse.Namespace) -> None:
    cases = list(LOADERS) + ["ferry load --gpu 0"]
    rows = []
    for member in members(args.dir):
        size = sum(os.path.getsize(p) for p in shard_files(member))
        if size < (4 << 30):
            continue
        page_in(member)
        for r in range(args.rounds):
            order = cases if r % 2 == 0 else list(reversed(cases))
            for case in order:
                try:
                    res = one_load(case, member, args.cli)
                except Exception as e:
                    res = {"error": str(e)[:300]}
                res.update({"member": os.path.basename(member), "case": case, "round": r,
                            "file_bytes": size})
                if "seconds" in res:
                    res["gbps"] = res["bytes"] / res["seconds"] / 1e9
                rows.append(res)
                print(json.dumps(res), flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    print("\n| member | case | GB/s, median (min..max of rounds) | with the imports, median "
          "| vs safetensors, medians |")
    print("| --- | --- | --- | --- | --- |")
    for member in sorted({r["member"] for r in rows}):
        def done(case: str) -> List[Dict[str, Any]]:
            return [r for r in rows if r["member"] == member and r["case"] == case and "gbps" in r]
        base = [r["gbps"] for r in done("safetensors.torch.load_file")]
        for case in cases:
            v = [r["gbps"] for r in done(case)]
            if not v:
                print(f"| {member} | {case} | failed | | |")
                continue
            with_imports = [r["bytes"] / (r["seconds"] + r["import_seconds"]) / 1e9
                            for r in done(case) if "import_seconds" in r]
            imported = (f"{statistics.median(with_imports):.1f}" if with_imports
                        else "(a process of its own)")
            ratio = f"{statistics.median(v) / statistics.median(base):.1f}x" if base else ""
            print(f"| {member} | {case} | {statistics.median(v):.1f} ({min(v):.1f} .. {max(v):.1f})"
                  f" | {imported} | {ratio} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("--dir", required=True)
    m.add_argument("--big", action="store_true", help="also the >= 4 GiB members (GPU)")
    c = sub.add_parser("check")
    c.add_argument("--dir", required=True)
    c.add_argument("--cli", required=True)
    c.add_argument("--device", default="cpu", help="cpu or cuda:N (one per process)")
    c.add_argument("--big", action="store_true",
                   help="also the big members, through ferry load and ferry.load_checkpoint")
    c.add_argument("--json")
    b = sub.add_parser("bench")
    b.add_argument("--dir", required=True)
    b.add_argument("--cli", required=True)
    b.add_argument("--rounds", type=int, default=3)
    b.add_argument("--json")
    d = sub.add_parser("digests")
    d.add_argument("--dir", required=True)
    d.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    if args.cmd == "make":
        cmd_make(args)
    elif args.cmd == "check":
        return cmd_check(args)
    elif args.cmd == "bench":
        cmd_bench(args)
    else:
        cmd_digests(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
