"""Goldens for Qwen3-MoE from Transformers itself (PyPI's transformers with PyTorch, on the CPU): tiny mixture-of-
experts models made and saved by Transformers, their logits, load-balancing loss and every parameter's gradient on a
padded batch, and greedy generation. tests/models/moe_test.cpp loads the saved folders and compares.

    python tests/reference/qwen3_moe_reference.py OUT_DIR      # writes OUT_DIR/{name}/ and OUT_DIR/moe_goldens.json

Models (f32, vocabulary 256, hidden 32, 4 heads of 8, 2 kv heads, 8 experts of width 16, 2 per token):
  topk_norm   norm_topk_prob true, both layers sparse; saved as Hub checkpoints are (one tensor per expert)
  dense_first norm_topk_prob false, mlp_only_layers [0] (layer 0 a dense MLP of width 48); saved in Transformers v5's
              stacked layout (save_original_format=False: mlp.experts.gate_up_proj, mlp.experts.down_proj)
Both with router_aux_loss_coef 0.5 (so the aux loss's share of the gradients is well above rounding) and
output_router_logits true.
"""
import json
import os
import sys

import torch
import transformers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

# Right-padded rows; the loss covers each row's real tokens.
ROWS = [[5, 17, 200, 33, 9, 41], [250, 3, 77, 12], [8, 8, 100, 64, 2, 19, 140]]
PROMPT = [[7, 99, 23, 180], [44, 5, 210, 31]]  # greedy generation, 8 new tokens each (no padding)

MODELS = {
    "topk_norm": dict(norm_topk_prob=True, mlp_only_layers=[], seed=11, original_format=True),
    "dense_first": dict(norm_topk_prob=False, mlp_only_layers=[0], seed=12, original_format=False),
}


def make(name, spec, out_dir):
    cfg = Qwen3MoeConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                         norm_topk_prob=spec["norm_topk_prob"], mlp_only_layers=spec["mlp_only_layers"], router_aux_loss_coef=0.5,
                         output_router_logits=True, tie_word_embeddings=False, max_position_embeddings=128, rms_norm_eps=1e-6,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.2)
    torch.manual_seed(spec["seed"])
    model = Qwen3MoeForCausalLM(cfg).float().eval()
    with torch.no_grad():  # norms away from 1, so their gradients and scales are exercised
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.2 * torch.randn_like(p))
    path = os.path.join(out_dir, name)
    model.save_pretrained(path, save_original_format=spec["original_format"])
    return model, path


def batch():
    B, T = len(ROWS), max(len(r) for r in ROWS)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.long)
    labels = torch.full((B, T), -100, dtype=torch.long)
    for b, r in enumerate(ROWS):
        ids[b, :len(r)] = torch.tensor(r)
        mask[b, :len(r)] = 1
        labels[b, :len(r)] = torch.tensor(r)  # Transformers shifts the labels itself
    return ids, mask, labels


def samples(name, g):
    flat = g.reshape(-1).double()
    n = flat.numel()
    gen = torch.Generator().manual_seed(len(name))
    idx = sorted(set([0, 1, n // 7, n // 3, n // 2, n - 1] + torch.randint(0, n, (24,), generator=gen).tolist()))
    return [[i, flat[i].item()] for i in idx]


def golden(model):
    ids, mask, labels = batch()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {}
    for n, p in model.named_parameters():
        g = p.grad.double() if p.grad is not None else torch.zeros_like(p, dtype=torch.float64)
        grads[n] = {"shape": list(p.shape), "sum": g.sum().item(), "sumsq": (g * g).sum().item(), "samples": samples(n, g)}
    logits = out.logits.detach().double()
    real = [[logits[b, t].tolist() for t in range(len(r))] for b, r in enumerate(ROWS)]
    with torch.no_grad():
        gen = model.generate(torch.tensor(PROMPT), attention_mask=torch.ones(len(PROMPT), len(PROMPT[0]), dtype=torch.long),
                             max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    return {
        "rows": ROWS,
        "loss": out.loss.item(),
        "aux_loss": out.aux_loss.item(),
        "ce_loss": (out.loss - model.config.router_aux_loss_coef * out.aux_loss).item(),
        "logits": real,
        "grads": grads,
        "prompt": PROMPT,
        "generated": gen[:, len(PROMPT[0]):].tolist(),
    }


def main():
    out_dir = sys.argv[1]
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    result = {"transformers_version": transformers.__version__, "torch_version": torch.__version__, "models": {}}
    for name, spec in MODELS.items():
        model, path = make(name, spec, out_dir)
        result["models"][name] = golden(model)
        print(f"{name}: loss {result['models'][name]['loss']:.6f} aux {result['models'][name]['aux_loss']:.6f} -> {path}")
    with open(os.path.join(out_dir, "moe_goldens.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
