#!/usr/bin/python3
"""PyTorch side of bench/run_generate.sh: the prefill and decode figures of `trl bench generate`, same shapes and
dtype, in the fastest honest eager configuration of Debian's PyTorch 1.13 on this machine: bf16 weights (oneDNN
bf16 matmuls), a preallocated KV cache written with index_copy_ (Transformers' StaticCache), and attention over
the filled part of the cache only (Transformers' eager attention over the static cache reads all of it). Greedy.
Prints one JSON line.

    /usr/bin/python3 bench/generate_torch.py --preset qwen3-0.6b --dtype bf16 --batch 8 --prompt_len 512 --new_tokens 64
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
from qwen3_reference import random_qwen3, rms_norm, rotate_half  # noqa: E402

PRESETS = {"tiny": (64, 128, 2, 4, 2, 16), "small": (256, 768, 4, 4, 2, 64), "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128)}


def forward_cached(cfg, W, ids, pos, caches, start):
    """ids, pos: [B,T]; caches: per layer (k, v) [B, Hkv, S, D]; writes slots start..start+T; returns last logits [B,V]."""
    B, T = ids.shape
    H, Hkv, D, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"], cfg["rms_norm_eps"]
    dtype = W["model.embed_tokens.weight"].dtype
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    freqs = pos[..., None].float() * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]
    L = start + T
    causal = torch.ones(T, L, dtype=torch.bool).tril(diagonal=start)
    add = torch.zeros(T, L, dtype=dtype).masked_fill(~causal, torch.finfo(dtype).min)
    slots = torch.arange(start, L)
    h = W["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = rms_norm(h, W[p + "input_layernorm.weight"], eps)
        q = (x @ W[p + "self_attn.q_proj.weight"].T).view(B, T, H, D)
        k = (x @ W[p + "self_attn.k_proj.weight"].T).view(B, T, Hkv, D)
        v = (x @ W[p + "self_attn.v_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps).transpose(1, 2)
        k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        kc, vc = caches[i]
        kc.index_copy_(2, slots, k)
        vc.index_copy_(2, slots, v)
        kk = kc[:, :, :L].repeat_interleave(H // Hkv, dim=1)
        vv = vc[:, :, :L].repeat_interleave(H // Hkv, dim=1)
        s = (q @ kk.transpose(2, 3)) * (D ** -0.5) + add
        a = torch.softmax(s, dim=-1, dtype=torch.float32).to(dtype) @ vv
        h = h + a.transpose(1, 2).reshape(B, T, H * D) @ W[p + "self_attn.o_proj.weight"].T
        x = rms_norm(h, W[p + "post_attention_layernorm.weight"], eps)
        g = x @ W[p + "mlp.gate_proj.weight"].T
        u = x @ W[p + "mlp.up_proj.weight"].T
        h = h + (torch.nn.functional.silu(g) * u) @ W[p + "mlp.down_proj.weight"].T
    h = rms_norm(h[:, -1], W["model.norm.weight"], eps)
    return (h @ W["model.embed_tokens.weight"].T).float()


def generate(cfg, W, ids, new_tokens):
    B, P = ids.shape
    S = P + new_tokens
    dtype = W["model.embed_tokens.weight"].dtype
    caches = [(torch.zeros(B, cfg["num_key_value_heads"], S, cfg["head_dim"], dtype=dtype),
               torch.zeros(B, cfg["num_key_value_heads"], S, cfg["head_dim"], dtype=dtype)) for _ in range(cfg["num_hidden_layers"])]
    pos = torch.arange(P)[None].expand(B, P)
    logits = forward_cached(cfg, W, ids, pos, caches, 0)
    for t in range(new_tokens - 1):
        nxt = logits.argmax(-1)[:, None]
        logits = forward_cached(cfg, W, nxt, torch.full((B, 1), P + t), caches, P + t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt_len", type=int, default=512)
    ap.add_argument("--new_tokens", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("TRL_NUM_THREADS", "2")))
    C, F, L, H, Hkv, D = PRESETS[a.preset]
    cfg, W, g = random_qwen3(C, F, a.layers or L, H, Hkv, D)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    W = {k: v.to(dtype) for k, v in W.items()}

    def timed(B, P, n):
        ids = torch.randint(0, 150000, (B, P), generator=g)
        generate(cfg, W, ids, n)
        t0 = time.perf_counter()
        generate(cfg, W, ids, n)
        return time.perf_counter() - t0

    with torch.no_grad():
        prefill = timed(1, a.prompt_len, 1)

        def decode(B):
            return B * (a.new_tokens - 1) / (timed(B, 16, a.new_tokens) - timed(B, 16, 1))

        d1, dn = decode(1), decode(a.batch)
    print(json.dumps({"bench": "torch_generate", "preset": a.preset, "layers": a.layers or L, "dtype": a.dtype,
                      "threads": torch.get_num_threads(), "prompt_len": a.prompt_len, "prefill_tokens_per_s": a.prompt_len / prefill,
                      "decode_tokens_per_s_batch1": d1, "decode_batch": a.batch, "decode_tokens_per_s_batchN": dn,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
