"""Writes a sharded safetensors checkpoint with a real model's tensor layout and random bytes:
qwen2-1.5b-like (arch-check's, 290 tensors in 2 shards) or mistral-7b (291 tensors, 14.5 GB,
split at 5 GB like save_pretrained's default, tensors in each file in name order as
safetensors writes them). Usage: mk_ckpt.py qwen|mistral DIR"""
import json, struct, sys
import numpy as np

def qwen():
    h, inter, kv, layers = 2048, 5504, 256, 24
    shapes = [("model.embed_tokens.weight", (151936 // 2, h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.q_proj.bias", (h,)),
                   (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
                   (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
                   (p + "self_attn.o_proj.weight", (h, h)), (p + "mlp.gate_proj.weight", (inter, h)),
                   (p + "mlp.up_proj.weight", (inter, h)), (p + "mlp.down_proj.weight", (h, inter)),
                   (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    shapes.append(("model.norm.weight", (h,)))
    half = len(shapes) // 2
    return [shapes[:half], shapes[half:]], False

def mistral():
    h, inter, kv, layers, vocab = 4096, 14336, 1024, 32, 32000
    shapes = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                   (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, h)),
                   (p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
                   (p + "mlp.down_proj.weight", (h, inter)), (p + "input_layernorm.weight", (h,)),
                   (p + "post_attention_layernorm.weight", (h,))]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    shards, cur, size = [], [], 0
    for t in shapes:
        n = int(np.prod(t[1])) * 2
        if cur and size + n > 5_000_000_000:
            shards.append(cur); cur, size = [], 0
        cur.append(t); size += n
    shards.append(cur)
    return shards, True

parts, by_name = {"qwen": qwen, "mistral": mistral}[sys.argv[1]]()
out = sys.argv[2]
chunk = np.random.default_rng(7).integers(0, 255, 64 << 20, dtype=np.uint8).tobytes()
weight_map = {}
for k, part in enumerate(parts):
    if by_name:
        part = sorted(part)
    name = f"model-{k + 1:05d}-of-{len(parts):05d}.safetensors"
    header, off = {}, 0
    for t, shape in part:
        n = int(np.prod(shape)) * 2
        header[t] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
        weight_map[t] = name
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(f"{out}/{name}", "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb)
        left = off
        while left:
            f.write(chunk[:min(left, len(chunk))])
            left -= min(left, len(chunk))
with open(f"{out}/model.safetensors.index.json", "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
