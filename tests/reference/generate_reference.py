#!/usr/bin/python3
"""Greedy generation goldens: the independent Qwen3 forward pass of qwen3_reference.py run over the whole sequence
at every step (no cache), Transformers' left padding and position ids, argmax of the f32 last-position logits.

    /usr/bin/python3 tests/reference/generate_reference.py MODEL_DIR OUT.json
"""
import json
import sys

import torch

from qwen3_reference import forward, load_safetensors

PROMPTS = [[785, 8585, 49041, 7506, 5302], [151644, 872, 198], [11, 220, 15, 16, 17, 18, 19, 20, 21]]
NEW_TOKENS = 12


def greedy(cfg, W, prompts):
    B, P = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(B, P, dtype=torch.int64)
    mask = torch.zeros(B, P, dtype=torch.int64)
    for b, p in enumerate(prompts):  # left padding (pad id 0 here; masked anyway)
        ids[b, P - len(p):] = torch.tensor(p)
        mask[b, P - len(p):] = 1
    out = [[] for _ in prompts]
    for _ in range(NEW_TOKENS):
        pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        logits = forward(cfg, W, ids, mask, pos)[:, -1, :].float()
        nxt = logits.argmax(-1)
        for b in range(B):
            out[b].append(int(nxt[b]))
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones(B, 1, dtype=torch.int64)], dim=1)
    return out


def main():
    model_dir, out_path = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    cfg = json.load(open(f"{model_dir}/config.json"))
    W = {k: v for k, v in load_safetensors(f"{model_dir}/model.safetensors").items()}
    with torch.no_grad():
        single = [greedy(cfg, W, [p])[0] for p in PROMPTS]
        batch = greedy(cfg, W, PROMPTS)
    json.dump({"prompts": PROMPTS, "new_tokens": NEW_TOKENS, "single": single, "batch": batch, "torch_version": torch.__version__},
              open(out_path, "w"))
    print(f"wrote {out_path}: single {single}, batch {batch}")


if __name__ == "__main__":
    main()
