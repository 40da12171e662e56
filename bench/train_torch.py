#!/usr/bin/python3
"""PyTorch side of bench/run_train.sh: the same training step as `trl bench train` (Qwen3 shapes, random weights,
SFT cross-entropy on random tokens, backward, AdamW), in the fastest honest configuration of Debian's PyTorch on
this machine: f32 master weights with torch.autocast(bfloat16) for --dtype bf16 (oneDNN bf16 matmuls), plain f32
for --dtype f32 (OpenBLAS), AdamW(foreach=True). With --lora_r R, the same step with a LoRA adapter of rank R on
every linear layer, written here (as PEFT computes it: x @ W.T + (alpha / r) * (x @ A.T) @ B.T): the base weights
frozen in the dtype (bf16 under --dtype bf16, as PEFT keeps a bf16 model), f32 adapters under autocast, AdamW on the
adapters only. With --gkd_beta B, a GKD step (lmbda 0) as TRL's GKDTrainer computes it: a teacher of the same
shapes (bf16 under --dtype bf16) run under no_grad, both models' logits over every position, TRL's
generalized_jsd_loss (log_softmax, F.kl_div with log targets, the logsumexp mixture) masked to the second half of
each sequence (the completion). Prints one JSON line.

    /usr/bin/python3 bench/train_torch.py --preset qwen3-0.6b --layers 2 --batch 1 --seq 128 --dtype bf16 --steps 3
"""
import argparse
import json
import os
import resource
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
from qwen3_reference import forward, random_qwen3  # noqa: E402

PRESETS = {"tiny": (64, 128, 2, 4, 2, 16), "small": (256, 768, 4, 4, 2, 64), "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lora_r", type=int, default=0)
    ap.add_argument("--lora_alpha", type=float, default=32)
    ap.add_argument("--gkd_beta", type=float, default=-1)
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", os.cpu_count())))
    C, F, L, H, Hkv, D = PRESETS[a.preset]
    L = a.layers or L
    V = 151936
    cfg, W, g = random_qwen3(C, F, L, H, Hkv, D, V)
    B, T = a.batch, a.seq
    ids = torch.randint(0, 151643, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.int64)
    pos = torch.arange(T).expand(B, T)
    linear = None
    if a.lora_r > 0:
        if a.dtype == "bf16":
            W = {n: p.to(torch.bfloat16) for n, p in W.items()}
        lora = {}
        for n, p in W.items():
            if n.endswith("_proj.weight"):
                out_f, in_f = p.shape
                lora[n[:-7]] = ((torch.rand(a.lora_r, in_f, generator=g) * 2 - 1) / in_f ** 0.5, torch.full((out_f, a.lora_r), 1e-3))
        params = [t.requires_grad_(True) for ab in lora.values() for t in ab]
        scaling = a.lora_alpha / a.lora_r

        def linear(x, module):
            A, Bm = lora[module]
            return x @ W[module + ".weight"].T + ((x @ A.T) @ Bm.T) * scaling
        opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, foreach=True)
    else:
        for p in W.values():
            p.requires_grad_(True)
        decay = [p for n, p in W.items() if "norm" not in n]
        no_decay = [p for n, p in W.items() if "norm" in n]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-5, foreach=True)

    teacher = None
    if a.gkd_beta >= 0:
        _, teacher, _ = random_qwen3(C, F, L, H, Hkv, D, V, seed=7)
        if a.dtype == "bf16":
            teacher = {n: p.to(torch.bfloat16) for n, p in teacher.items()}
        labels = ids.clone()
        labels[:, : T - T // 2] = -100  # the prompt: the first half

    def gkd_loss(student_logits, teacher_logits, beta):
        s = torch.nn.functional.log_softmax(student_logits, dim=-1)
        t = torch.nn.functional.log_softmax(teacher_logits, dim=-1)
        if beta == 0:
            jsd = torch.nn.functional.kl_div(s, t, reduction="none", log_target=True)
        elif beta == 1:
            jsd = torch.nn.functional.kl_div(t, s, reduction="none", log_target=True)
        else:
            b = torch.tensor(beta, dtype=s.dtype)
            m = torch.logsumexp(torch.stack([s + torch.log1p(-b), t + torch.log(b)]), dim=0)
            jsd = b * torch.nn.functional.kl_div(m, t, reduction="none", log_target=True) + (1 - b) * torch.nn.functional.kl_div(m, s, reduction="none", log_target=True)
        keep = labels[:, 1:] != -100
        return jsd[keep].sum() / keep.sum()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = forward(cfg, W, ids, mask, pos, linear)
            if teacher is not None:
                with torch.no_grad():
                    teacher_logits = forward(cfg, teacher, ids, mask, pos)
        if teacher is not None:
            loss = gkd_loss(logits[:, :-1], teacher_logits[:, :-1], a.gkd_beta)
        else:
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, V), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    best = min(times)
    print(json.dumps({"bench": "torch_train", "preset": a.preset, "layers": L, "lora_r": a.lora_r, "gkd_beta": a.gkd_beta, "dtype": a.dtype, "batch": B, "seq": T,
                      "threads": torch.get_num_threads(), "step_seconds_best": best, "tokens_per_s": B * T / best,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "loss": loss, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
