#!/usr/bin/python3
"""Independent Qwen3 forward pass in PyTorch, used to produce the golden logits that the C++ tests compare against.

Run with Debian's PyTorch (apt-get install python3-torch), not a PyPI one:
    /usr/bin/python3 tests/reference/qwen3_reference.py MODEL_DIR OUT.json [--emulate | --hf-folder]

--hf-folder first checks that MODEL_DIR is a complete Hugging Face model folder, as Transformers'
AutoModelForCausalLM.from_pretrained and AutoTokenizer.from_pretrained need it (used on the folder `trl sft` saves).

The model follows Transformers' modeling_qwen3.py (eager attention path) as described in docs/MODELS.md:
pre-norm decoder, q/k RMSNorm before RoPE (rotate-half layout), GQA by repeating KV heads, fp32 softmax cast to
the activation dtype, SwiGLU MLP, RMSNorm that casts back to the input dtype *before* the weight multiply, tied
lm_head. It reads model.safetensors itself (no safetensors/transformers package), so it shares no code with
trl.cpp.
"""
import json
import struct
import sys

import numpy as np
import torch


def weight_samples(W):
    """A few exact values of every tensor, so the C++ test can check that it regenerated the same model."""
    out = {}
    for name in sorted(W):
        flat = W[name].reshape(-1).to(torch.float64)
        n = flat.numel()
        idx = sorted(set([0, 1, n // 7, n // 3, n // 2, n - 2, n - 1]))
        out[name] = [[i, flat[i].item()] for i in idx if 0 <= i < n]
    return out


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[b:e]
        shape = info["shape"]
        if info["dtype"] == "F32":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy()).reshape(shape)
        elif info["dtype"] == "BF16":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.int16).copy()).view(torch.bfloat16).reshape(shape)
        else:
            raise ValueError(f"{name}: dtype {info['dtype']} not handled by the reference script")
        out[name] = t
    return out


def random_qwen3(C, F, L, H, Hkv, D, V=151936, seed=0):
    """A config and random weights (N(0, 0.02) matrices, unit norms) for benchmarks."""
    cfg = dict(hidden_size=C, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=Hkv, head_dim=D,
               vocab_size=V, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True)
    g = torch.Generator().manual_seed(seed)
    W = {"model.embed_tokens.weight": torch.randn(V, C, generator=g) * 0.02, "model.norm.weight": torch.ones(C)}
    for i in range(L):
        p = f"model.layers.{i}."
        for n, s in [("self_attn.q_proj", (H * D, C)), ("self_attn.k_proj", (Hkv * D, C)), ("self_attn.v_proj", (Hkv * D, C)),
                     ("self_attn.o_proj", (C, H * D)), ("mlp.gate_proj", (F, C)), ("mlp.up_proj", (F, C)), ("mlp.down_proj", (C, F))]:
            W[p + n + ".weight"] = torch.randn(*s, generator=g) * 0.02
        for n, s in [("input_layernorm", C), ("post_attention_layernorm", C), ("self_attn.q_norm", D), ("self_attn.k_norm", D)]:
            W[p + n + ".weight"] = torch.ones(s)
    return cfg, W, g


def rms_norm(x, w, eps):
    in_dtype = x.dtype
    x32 = x.to(torch.float32)
    var = x32.pow(2).mean(-1, keepdim=True)
    y = x32 * torch.rsqrt(var + eps)
    return w * y.to(in_dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def forward(cfg, W, ids, mask, pos, linear=None):
    """ids, mask, pos: int64 [B,T]. Returns logits [B,T,V] in the model dtype. linear(x, module) replaces the
    projections' x @ W[module.weight].T (lora_reference.py adds its adapters there)."""
    B, T = ids.shape
    if linear is None:
        def linear(x, module):
            return x @ W[module + ".weight"].T
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    dtype = W["model.embed_tokens.weight"].dtype
    h = W["model.embed_tokens.weight"][ids]

    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    freqs = pos.float()[:, :, None] * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos().to(dtype)[:, None, :, :]  # [B,1,T,D]
    sin = emb.sin().to(dtype)[:, None, :, :]

    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    allowed = causal[None, None, :, :] & (mask[:, None, None, :] != 0)  # [B,1,T,S]
    min_value = torch.finfo(dtype).min
    additive = torch.zeros(B, 1, T, T, dtype=dtype).masked_fill(~allowed, min_value)

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        r = h
        x = rms_norm(h, W[p + "input_layernorm.weight"], eps)
        q = linear(x, p + "self_attn.q_proj").view(B, T, H, D)
        k = linear(x, p + "self_attn.k_proj").view(B, T, Hkv, D)
        v = linear(x, p + "self_attn.v_proj").view(B, T, Hkv, D)
        q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps).transpose(1, 2)
        k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps).transpose(1, 2)
        v = v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = H // Hkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = (q @ k.transpose(2, 3)) * (D ** -0.5) + additive
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(dtype)
        a = (probs @ v).transpose(1, 2).reshape(B, T, H * D)
        h = r + linear(a, p + "self_attn.o_proj")
        r = h
        x = rms_norm(h, W[p + "post_attention_layernorm.weight"], eps)
        gate = linear(x, p + "mlp.gate_proj")
        up = linear(x, p + "mlp.up_proj")
        h = r + linear(torch.nn.functional.silu(gate) * up, p + "mlp.down_proj")
    h = rms_norm(h, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    return h @ head.T


def forward_emulated(cfg, W, ids, mask, pos, store_dtype):
    """The same network computed in float64, rounding each stored activation to `store_dtype` (through f32, as
    trl.cpp's reference backend does) exactly where the eager model above stores one. Accumulation is exact
    enough that two such implementations agree to ~1e-12 before rounding, so rounding flips (which make eager bf16
    runs diverge chaotically) essentially never happen: this golden checks the rounding points tightly."""
    def r(x):
        return x.to(torch.float32).to(store_dtype).to(torch.float64)

    B, T = ids.shape
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    W = {k: v.to(torch.float64) for k, v in W.items()}

    def norm(x, w):
        y = r(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
        return r(w * y)

    h = W["model.embed_tokens.weight"][ids]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    freqs = pos.float()[:, :, None] * inv_freq[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1).to(torch.float64)
    cos = r(emb.cos())[:, None, :, :]
    sin = r(emb.sin())[:, None, :, :]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    allowed = causal[None, None, :, :] & (mask[:, None, None, :] != 0)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = norm(h, W[p + "input_layernorm.weight"])
        q = r(x @ W[p + "self_attn.q_proj.weight"].T).view(B, T, H, D)
        k = r(x @ W[p + "self_attn.k_proj.weight"].T).view(B, T, Hkv, D)
        v = r(x @ W[p + "self_attn.v_proj.weight"].T).view(B, T, Hkv, D)
        q = norm(q, W[p + "self_attn.q_norm.weight"]).transpose(1, 2)
        k = norm(k, W[p + "self_attn.k_norm.weight"]).transpose(1, 2)
        v = v.transpose(1, 2)
        q = r(r(q * cos) + r(rotate_half(q) * sin))
        k = r(r(k * cos) + r(rotate_half(k) * sin))
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
        scores = r(r(q @ k.transpose(2, 3)) * (D ** -0.5)).masked_fill(~allowed, float("-inf"))
        probs = r(torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0))  # rows with no visible key: zeros
        a = r(probs @ v).transpose(1, 2).reshape(B, T, H * D)
        h = r(h + r(a @ W[p + "self_attn.o_proj.weight"].T))
        x = norm(h, W[p + "post_attention_layernorm.weight"])
        gate = r(x @ W[p + "mlp.gate_proj.weight"].T)
        up = r(x @ W[p + "mlp.up_proj.weight"].T)
        act = r(gate / (1.0 + torch.exp(-gate)))
        h = r(h + r(r(act * up) @ W[p + "mlp.down_proj.weight"].T))
    h = norm(h, W["model.norm.weight"])
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    return r(h @ head.T)


# Token sequences of the golden cases (ids < 151669, the real tokenizer's range, plus a few rare ones).
SEQUENCES = [
    [785, 8585, 49041, 7506, 5302],                                  # "The French Bread Law states"
    [151644, 872, 198, 9707, 0, 151645, 198, 151644, 77091, 198],    # a chat-like sequence
    [13, 220, 15, 16, 17, 151643, 42, 99999, 151935, 3],             # digits, eos, an id in the padding rows of the embedding
    [11],
]
# Columns whose logits are stored for every position (the full row is summarised by logsumexp, sum, sum of squares).
COLUMNS = sorted(set([0, 1, 2, 3, 11, 13, 15, 198, 220, 785, 872, 5302, 7506, 8585, 9707, 42334, 49041, 77091, 99999,
                      151643, 151644, 151645, 151668, 151935] + list(range(1000, 151936, 4999))))


def row_summary(row64):
    lse = torch.logsumexp(row64, dim=0).item()
    return {
        "logsumexp": lse,
        "sum": row64.sum().item(),
        "sumsq": (row64 * row64).sum().item(),
        "argmax": int(torch.argmax(row64).item()),
        "columns": [row64[c].item() for c in COLUMNS],
    }


def run_case(cfg, W, rows, pad_side, emulate):
    B = len(rows)
    T = max(len(r) for r in rows)
    ids = torch.zeros(B, T, dtype=torch.int64)
    mask = torch.zeros(B, T, dtype=torch.int64)
    for b, r in enumerate(rows):
        off = T - len(r) if pad_side == "left" else 0
        ids[b, off:off + len(r)] = torch.tensor(r)
        mask[b, off:off + len(r)] = 1
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        if emulate:
            logits = forward_emulated(cfg, W, ids, mask, pos, W["model.embed_tokens.weight"].dtype)
        else:
            logits = forward(cfg, W, ids, mask, pos).to(torch.float64)
    out = {"pad_side": pad_side, "input_ids": ids.tolist(), "attention_mask": mask.tolist(), "positions": []}
    for b in range(B):
        for t in range(T):
            if mask[b, t]:
                s = row_summary(logits[b, t])
                s["b"], s["t"] = b, t
                out["positions"].append(s)
    return out


def check_hf_folder(model_dir, cfg, W):
    """The files and fields Transformers reads for a tied Qwen3 checkpoint; raises on anything missing or extra."""
    import os
    for f in ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]:
        if not os.path.isfile(os.path.join(model_dir, f)):
            raise SystemExit(f"{model_dir}: no {f}")
    if cfg.get("model_type") != "qwen3" or cfg.get("architectures") != ["Qwen3ForCausalLM"]:
        raise SystemExit(f"{model_dir}/config.json: model_type {cfg.get('model_type')} architectures {cfg.get('architectures')}")
    for key in ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "vocab_size", "rms_norm_eps", "rope_theta", "tie_word_embeddings", "max_position_embeddings", "torch_dtype"]:
        if key not in cfg:
            raise SystemExit(f"{model_dir}/config.json: no {key}")
    C, F, D = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    H, Hkv, V = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    want = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
    if not cfg["tie_word_embeddings"]:
        want["lm_head.weight"] = [V, C]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        want.update({p + "input_layernorm.weight": [C], p + "post_attention_layernorm.weight": [C],
                     p + "self_attn.q_proj.weight": [H * D, C], p + "self_attn.k_proj.weight": [Hkv * D, C],
                     p + "self_attn.v_proj.weight": [Hkv * D, C], p + "self_attn.o_proj.weight": [C, H * D],
                     p + "self_attn.q_norm.weight": [D], p + "self_attn.k_norm.weight": [D],
                     p + "mlp.gate_proj.weight": [F, C], p + "mlp.up_proj.weight": [F, C], p + "mlp.down_proj.weight": [C, F]})
    got = {k: list(v.shape) for k, v in W.items()}
    if got != want:
        raise SystemExit(f"{model_dir}/model.safetensors: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}, "
                         f"wrong shapes {[k for k in want if k in got and got[k] != want[k]]}")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg["torch_dtype"]]
    if any(v.dtype != dtype for v in W.values()):
        raise SystemExit(f"{model_dir}: tensors are not all {cfg['torch_dtype']} as config.json says")
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    if tok["model"]["type"] != "BPE" or len(tok["model"]["vocab"]) + len(tok["added_tokens"]) > V:
        raise SystemExit(f"{model_dir}/tokenizer.json: not a BPE tokenizer that fits the vocabulary")
    return sorted(os.listdir(model_dir))


def main():
    model_dir, out_path = sys.argv[1], sys.argv[2]
    emulate = len(sys.argv) > 3 and sys.argv[3] == "--emulate"
    hf_folder = len(sys.argv) > 3 and sys.argv[3] == "--hf-folder"
    torch.manual_seed(0)
    torch.set_num_threads(2)
    cfg = json.load(open(f"{model_dir}/config.json"))
    W = load_safetensors(f"{model_dir}/model.safetensors")
    files = check_hf_folder(model_dir, cfg, W) if hf_folder else None
    cases = [run_case(cfg, W, [s], "right", emulate) for s in SEQUENCES]
    cases.append(run_case(cfg, W, SEQUENCES[:3], "left", emulate))
    cases.append(run_case(cfg, W, SEQUENCES, "right", emulate))
    golden = {
        "model_dir_config": cfg,
        "weight_samples": weight_samples(W),
        "dtype": str(W["model.embed_tokens.weight"].dtype),
        "mode": "float64 with rounding emulated" if emulate else "eager",
        "torch_version": torch.__version__,
        "columns": COLUMNS,
        "cases": cases,
    }
    if files is not None:
        golden["hf_folder_files"] = files
    with open(out_path, "w") as f:
        json.dump(golden, f)
    print(f"wrote {out_path}: {sum(len(c['positions']) for c in cases)} positions")


if __name__ == "__main__":
    main()
