#!/usr/bin/python3
"""PyTorch side of bench/run_dpo.sh: the same DPO step as `trl bench dpo` (Qwen3 shapes, random weights, random
pairs of a seq/2 prompt and seq/2 completions, the sigmoid loss with beta 0.1, backward, AdamW), in the fastest
honest configuration of Debian's PyTorch here: the policy's f32 master weights under torch.autocast(bfloat16) for
--dtype bf16, the frozen reference a bf16 copy run under no_grad (TRL loads it as the policy is loaded); plain f32
for --dtype f32. With --precompute_ref_log_probs the reference runs once before the steps and is then deleted.
Prints one JSON line.

    /usr/bin/python3 bench/dpo_torch.py --preset qwen3-0.6b --layers 4 --pairs 2 --seq 512 --dtype bf16 --steps 3
"""
import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
from qwen3_reference import forward, random_qwen3  # noqa: E402

PRESETS = {"tiny": (64, 128, 2, 4, 2, 16), "small": (256, 768, 4, 4, 2, 64), "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--precompute_ref_log_probs", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", os.cpu_count())))
    C, Fd, L, H, Hkv, D = PRESETS[a.preset]
    L = a.layers or L
    V = 151936
    cfg, W, g = random_qwen3(C, Fd, L, H, Hkv, D, V)
    bf16 = a.dtype == "bf16"
    ref_W = {n: p.detach().clone().to(torch.bfloat16 if bf16 else torch.float32) for n, p in W.items()}
    for p in W.values():
        p.requires_grad_(True)
    N, T, half = a.pairs, a.seq, a.seq // 2
    prompt = torch.randint(0, 151643, (N, half), generator=g)
    chosen = torch.randint(0, 151643, (N, T - half), generator=g)
    rejected = torch.randint(0, 151643, (N, T - half), generator=g)
    ids = torch.cat([torch.cat([prompt, chosen], 1), torch.cat([prompt, rejected], 1)], 0)  # [chosen; rejected]
    mask = torch.ones(2 * N, T, dtype=torch.int64)
    pos = torch.arange(T).expand(2 * N, T)
    completion = torch.zeros(2 * N, T - 1)
    completion[:, half - 1:] = 1  # position t predicts token t + 1; the completion starts at token `half`
    opt = torch.optim.AdamW([p for p in W.values()], lr=1e-6, weight_decay=0.01, foreach=True)

    def seq_logps(weights):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = forward(cfg, weights, ids, mask, pos)
        logp = torch.gather(logits[:, :-1].float().log_softmax(-1), 2, ids[:, 1:, None])[..., 0]
        return (logp * completion).sum(1)

    def ref_logps():
        with torch.no_grad():
            return seq_logps(ref_W)

    precomputed = None
    t_pre = 0.0
    if a.precompute_ref_log_probs:
        t0 = time.perf_counter()
        precomputed = ref_logps()
        t_pre = time.perf_counter() - t0
        ref_W.clear()

    def step():
        opt.zero_grad(set_to_none=True)
        ref = precomputed if precomputed is not None else ref_logps()
        pol = seq_logps(W)
        d = (pol[:N] - ref[:N]) - (pol[N:] - ref[N:])
        loss = -F.logsigmoid(0.1 * d).mean()
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
    print(json.dumps({"bench": "torch_dpo", "preset": a.preset, "layers": L, "dtype": a.dtype, "pairs": N, "seq": T,
                      "threads": torch.get_num_threads(), "precompute_ref_log_probs": a.precompute_ref_log_probs,
                      "step_seconds_best": best, "tokens_per_s": 2 * N * T / best, "precompute_seconds": t_pre,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "loss": loss,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
