#!/usr/bin/python3
"""PyTorch side of bench/run_grpo.sh: the GRPO step of `trl grpo` on the same shapes (Qwen3 layers, random weights,
P prompt tokens, G completions of N new tokens sampled at temperature 1, the dapo loss), in the fastest honest eager
configuration of Debian's PyTorch 1.13 here:
  generation  the policy's weights cast to bf16 once per step, then the static-cache decode loop of
              bench/generate_torch.py (a preallocated KV cache written with index_copy_), multinomial sampling;
  rewards     -|200 - characters| / 100 with 4 characters per token (no tokenizer here; it costs nothing either way);
  training    f32 master weights under torch.autocast(bfloat16), the lm_head only on the completion positions (TRL's
              logits_to_keep), log-softmax, entropy (TRL computes it for its metrics), the clipped surrogate with
              ratio 1 and group-normalised advantages, backward and AdamW(foreach=True), in micro-batches of
              per_device_train_batch_size rows (gradient accumulation).
Prints one JSON line with each part's best time over the steps after the first.

    /usr/bin/python3 bench/grpo_torch.py --preset qwen3-0.6b --prompts 1 --generations 4 --batch 4 --prompt_len 256 --new_tokens 128
"""
import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
sys.path.insert(0, os.path.dirname(__file__))
from generate_torch import forward_cached  # noqa: E402
from qwen3_reference import forward, random_qwen3  # noqa: E402

PRESETS = {"tiny": (64, 128, 2, 4, 2, 16), "small": (256, 768, 4, 4, 2, 64), "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4, help="rows per training micro-batch")
    ap.add_argument("--prompt_len", type=int, default=256)
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", os.cpu_count())))
    C, Fd, L, H, Hkv, D = PRESETS[a.preset]
    L = a.layers or L
    V = 151936
    cfg, W, g = random_qwen3(C, Fd, L, H, Hkv, D, V)
    for p in W.values():
        p.requires_grad_(True)
    opt = torch.optim.AdamW(list(W.values()), lr=1e-6, weight_decay=0.0, foreach=True)
    B, P, N = a.prompts * a.generations, a.prompt_len, a.new_tokens
    prompts = torch.randint(0, 151643, (a.prompts, P), generator=g).repeat_interleave(a.generations, 0)
    head_cfg = dict(cfg, tie_word_embeddings=False)

    def generate():
        with torch.no_grad():
            Wb = {k: v.detach().to(torch.bfloat16) for k, v in W.items()}
            S = P + N
            caches = [(torch.zeros(B, Hkv, S, D, dtype=torch.bfloat16), torch.zeros(B, Hkv, S, D, dtype=torch.bfloat16)) for _ in range(L)]
            pos = torch.arange(P).expand(B, P)
            logits = forward_cached(cfg, Wb, prompts, pos, caches, 0)
            out = []
            for t in range(N):
                tok = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)
                out.append(tok)
                if t + 1 < N:
                    logits = forward_cached(cfg, Wb, tok, torch.full((B, 1), P + t), caches, P + t)
            return torch.cat(out, 1)

    def train(completions, adv):
        opt.zero_grad(set_to_none=True)
        ids = torch.cat([prompts, completions], 1)
        T = ids.shape[1]
        eye = {**W, "lm_head.weight": torch.eye(C)}
        for s in range(0, B, a.batch):
            x = ids[s:s + a.batch]
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = forward(head_cfg, eye, x, torch.ones_like(x), torch.arange(T).expand(x.shape[0], T))  # the final norm's output
                logits = h[:, P - 1:T - 1] @ W["model.embed_tokens.weight"].T
            lp = logits.float().log_softmax(-1)
            logp = torch.gather(lp, 2, x[:, P:, None])[..., 0]
            entropy = -(lp.exp() * lp).sum(-1).detach()
            ratio = torch.exp(logp - logp.detach())
            A = adv[s:s + a.batch, None]
            loss = -torch.min(ratio * A, torch.clamp(ratio, 0.8, 1.2) * A).sum() / (B * N)
            loss.backward()
        opt.step()
        return loss.item(), entropy.mean().item()

    times = {"generation": [], "rewards": [], "training": [], "step": []}
    for _ in range(a.steps + 1):
        t0 = time.perf_counter()
        completions = generate()
        t1 = time.perf_counter()
        r = -torch.abs(200 - 4.0 * N - torch.zeros(B)) / 100 + 0.01 * torch.randn(B, generator=g)
        grouped = r.view(-1, a.generations)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
        t2 = time.perf_counter()
        train(completions, adv)
        t3 = time.perf_counter()
        for k, v in (("generation", t1 - t0), ("rewards", t2 - t1), ("training", t3 - t2), ("step", t3 - t0)):
            times[k].append(v)
    best = {k: min(v[1:]) for k, v in times.items()}
    print(json.dumps({"bench": "torch_grpo", "preset": a.preset, "layers": L, "prompts": a.prompts, "generations": a.generations,
                      "batch": a.batch, "prompt_len": P, "new_tokens": N, "threads": torch.get_num_threads(),
                      "step_seconds_best": best["step"], "generation_seconds": best["generation"], "reward_seconds": best["rewards"],
                      "training_seconds": best["training"], "first_step_seconds": times["step"][0],
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
