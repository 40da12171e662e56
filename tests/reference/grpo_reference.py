#!/usr/bin/python3
"""Goldens for GRPO and RLOO on the tiny model (tests/train/grpo_golden_test.cpp): given a fixed round of prompts,
completions, rewards and old / reference per-token log-probs, the advantages, the loss, TRL's metrics and every
parameter's gradient (its norms, sum and 8 entries), for each loss_type, scale_rewards, multi-objective aggregation,
beta > 0, importance_sampling_level sequence, num_iterations 2 (old log-probs that differ from the current ones,
so that the ratio is clipped), delta, mask_truncated_completions, a sampling temperature, two micro-batches, and
RLOO with its KL penalty, normalisation and reward clipping.

Written from TRL's formulas (grpo_trainer.py, rloo_trainer.py) with the independent forward pass of
qwen3_reference.py in float32 (each row unpadded, positions from 0), the losses in float64 and torch.autograd.

    /usr/bin/python3 tests/reference/grpo_reference.py MODEL_DIR OUT.json
"""
import json
import math
import sys

import torch

from preference_train_reference import grad_summary
from qwen3_reference import forward, load_safetensors

EOS = 151645
G = 4
PROMPTS = [[785, 8585, 49, 7], [151, 872, 198]]
# (prompt index, completion ids): rows of a group are consecutive; three are truncated (no EOS).
ROWS = [(0, [5302, 13, 11, EOS]), (0, [220, 15, 16, 17, 18]), (0, [9707, EOS]), (0, [42, 43, 44, 45, EOS]),
        (1, [300, 301, EOS]), (1, [302, 303, 304, 305, 306]), (1, [EOS]), (1, [11, 220, 15, 16])]
MAX_COMPLETION_LENGTH = 5
NAN = float("nan")
# Two reward functions (NaN = None); row 5 has only the second one's, none is unscorable.
REWARDS = [[1.0, 0.1], [0.5, 0.2], [0.0, 0.3], [2.0, NAN], [0.3, NAN], [NAN, 0.5], [0.3, 0.5], [1.2, 0.0]]
WEIGHTS = [1.0, 0.5]

GRPO_CASES = [
    {"name": "dapo", "loss_type": "dapo"},
    {"name": "grpo", "loss_type": "grpo"},
    {"name": "bnpo", "loss_type": "bnpo"},
    {"name": "dr_grpo", "loss_type": "dr_grpo"},
    {"name": "scale_batch", "loss_type": "dapo", "scale_rewards": "batch"},
    {"name": "scale_none", "loss_type": "grpo", "scale_rewards": "none"},
    {"name": "normalize_then_sum", "loss_type": "dapo", "multi_objective_aggregation": "normalize_then_sum"},
    {"name": "beta", "loss_type": "dapo", "beta": 0.1, "ref": True},
    {"name": "num_iterations_2", "loss_type": "dapo", "old": True, "epsilon_high": 0.28},
    {"name": "num_iterations_2_grpo_delta", "loss_type": "grpo", "old": True, "delta": 1.25},
    {"name": "sequence", "loss_type": "dapo", "importance_sampling_level": "sequence", "old": True, "beta": 0.05, "ref": True},
    {"name": "sequence_bnpo", "loss_type": "bnpo", "importance_sampling_level": "sequence", "old": True},
    {"name": "mask_truncated", "loss_type": "dapo", "mask_truncated_completions": True, "old": True},
    {"name": "temperature", "loss_type": "dapo", "temperature": 0.7, "old": True, "beta": 0.1, "ref": True},
    {"name": "two_micro_batches_dapo", "loss_type": "dapo", "old": True, "micro_batches": 2},
    {"name": "two_micro_batches_grpo", "loss_type": "grpo", "old": True, "micro_batches": 2},
]
RLOO_CASES = [
    {"name": "rloo", "beta": 0.0, "old": True},
    {"name": "rloo_kl", "beta": 0.05, "old": True, "ref": True},
    {"name": "rloo_normalized_clipped", "beta": 0.05, "old": True, "ref": True, "normalize_advantages": True,
     "reward_clip_range": [-0.5, 1.5], "epsilon_high": 0.3},
    {"name": "rloo_two_micro_batches", "beta": 0.0, "old": True, "micro_batches": 2},
]


def load(model_dir):
    cfg = json.load(open(f"{model_dir}/config.json"))
    raw = load_safetensors(f"{model_dir}/model.safetensors")
    return cfg, {k: v.float().clone() for k, v in raw.items()}


def token_stats(cfg, W, temperature):
    """Per row: log p of each completion token and the entropy of each position's distribution, of logits / T."""
    logps, ents = [], []
    for p, c in ROWS:
        ids = PROMPTS[p] + c
        t = torch.tensor([ids])
        logits = forward(cfg, W, t, torch.ones_like(t), torch.arange(len(ids))[None]).float()[0] / temperature
        lp = torch.log_softmax(logits, dim=-1)
        at = torch.arange(len(PROMPTS[p]) - 1, len(ids) - 1)
        logps.append(lp[at, torch.tensor(c)].double())
        ents.append((-(lp[at].exp() * lp[at]).sum(-1)).double().detach())
    return logps, ents


def padded(rows, width):
    out = torch.zeros(len(rows), width, dtype=torch.float64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def offsets(kind):
    """Fixed per-token shifts of the starting log-probs: the old (num_iterations > 1) and reference log-probs."""
    f = math.sin if kind == "old" else math.cos
    a = 0.3 if kind == "old" else 0.2
    return [[a * f(1.0 + 7 * i + t) for t in range(len(c))] for i, (_, c) in enumerate(ROWS)]


def nanstd(x, dim=None):
    if dim is None:
        x = x.flatten()
        dim = 0
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dim)
    count = (~torch.isnan(x)).sum(dim=dim)
    return torch.sqrt(var * count / (count - 1))


def grpo_advantages(case):
    R = torch.tensor(REWARDS, dtype=torch.float64)
    w = torch.tensor(WEIGHTS, dtype=torch.float64)
    unscorable = torch.isnan(R).all(dim=1)
    scale = case.get("scale_rewards", "group")
    if case.get("multi_objective_aggregation", "sum_then_normalize") == "sum_then_normalize":
        r = (R * w).nansum(dim=1)
        r[unscorable] = NAN
        mean = torch.nanmean(r.view(-1, G), dim=1).repeat_interleave(G)
        std = nanstd(r.view(-1, G), dim=1).repeat_interleave(G) if scale != "batch" else nanstd(r).expand_as(r)
        adv = r - mean
        if scale != "none":
            adv = adv / (std + 1e-4)
    else:
        grouped = R.view(-1, G, R.shape[1])
        mk = torch.nanmean(grouped, dim=1, keepdim=True)
        sk = nanstd(grouped, dim=1).unsqueeze(1)
        rk = ((grouped - mk) / (sk + 1e-4)).view(-1, R.shape[1])
        r = (rk * w).nansum(dim=1)
        r[unscorable] = NAN
        std = nanstd(r).expand_as(r)
        adv = (r - torch.nanmean(r)) / (std + 1e-4)
    is_zero = torch.isclose(std, torch.zeros_like(std))
    return torch.nan_to_num(adv, nan=0.0), is_zero.double().mean().item()


def rloo_advantages(case, old, ref, mask):
    R = torch.tensor(REWARDS, dtype=torch.float64)
    w = torch.tensor(WEIGHTS, dtype=torch.float64)
    unscorable = torch.isnan(R).all(dim=1)
    r = (R * w).nansum(dim=1)
    r[unscorable] = NAN
    if case.get("reward_clip_range"):
        lo, hi = case["reward_clip_range"]
        r = r.clamp(min=lo, max=hi)
    if case["beta"] != 0.0:
        r = r - case["beta"] * ((old - ref) * mask).sum(-1)
    grouped = r.view(-1, G)
    std = nanstd(grouped, dim=1)
    counts = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    total = torch.nansum(grouped, dim=1, keepdim=True)
    adv = r - ((total - grouped) / (counts - 1)).view(-1)
    if case.get("normalize_advantages"):
        adv = (adv - torch.nanmean(adv)) / (nanstd(adv) + 1e-4)
    is_zero = torch.isclose(std, torch.zeros_like(std))
    return torch.nan_to_num(adv, nan=0.0), is_zero.repeat_interleave(G).double().mean().item()


def masks(case):
    width = max(len(c) for _, c in ROWS)
    m = torch.zeros(len(ROWS), width, dtype=torch.float64)
    for i, (_, c) in enumerate(ROWS):
        truncated = c[-1] != EOS
        if not (case.get("mask_truncated_completions") and truncated):
            m[i, : len(c)] = 1
    return m


def grpo_micro_loss(case, lp, old, ref, mask, adv, num_items, micro_batches):
    """TRL's GRPOTrainer._compute_loss on one micro-batch, and its metrics."""
    eps_low, eps_high = 0.2, case.get("epsilon_high", 0.2)
    log_ratio = lp - old
    if case.get("importance_sampling_level", "token") == "sequence":
        liw = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    else:
        liw = log_ratio
    coef_1 = torch.exp(liw)
    A = adv.unsqueeze(1)
    beta = case.get("beta", 0.0)
    if beta != 0.0:
        kl = torch.exp(ref - lp) - (ref - lp) - 1
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    if case.get("delta") is not None:
        coef_1 = torch.clamp(coef_1, max=case["delta"])
    ptl = -torch.min(coef_1 * A, coef_2 * A)
    if beta != 0.0:
        ptl = ptl + beta * kl
    t = case["loss_type"]
    if t == "grpo":
        loss = ((ptl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / micro_batches
    elif t == "bnpo":
        loss = (ptl * mask).sum() / mask.sum().clamp(min=1.0) / micro_batches
    elif t == "dr_grpo":
        loss = (ptl * mask).sum() / (ptl.size(0) * MAX_COMPLETION_LENGTH) / micro_batches
    else:
        loss = (ptl * mask).sum() / max(num_items, 1.0)

    def gmm(x):
        if x.shape[1] == 1:
            return (x.sum() / x.shape[0]).item()
        return ((x * mask).sum() / mask.sum().clamp(min=1.0)).item()

    def seq_mean(x):
        return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

    ratio = coef_1  # after delta's cap, as TRL's metrics read it (delta > 1 + epsilon_high: the same counts)
    low = ((ratio < 1 - eps_low) & (A < 0)).double()
    high = ((ratio > 1 + eps_high) & (A > 0)).double()
    region = ((low + high) > 0).double()

    def nanmin(x):
        x = x[~torch.isnan(x)]
        return x.min().item() if x.numel() else None

    def nanmax(x):
        x = x[~torch.isnan(x)]
        return x.max().item() if x.numel() else None

    metrics = {"clip_ratio/low_mean": gmm(low), "clip_ratio/high_mean": gmm(high), "clip_ratio/region_mean": gmm(region),
               "clip_ratio/low_min": nanmin(seq_mean(low).detach()), "clip_ratio/high_max": nanmax(seq_mean(high).detach())}
    if beta != 0.0:
        metrics["kl"] = gmm(kl.detach())
    return loss, metrics


def rloo_micro_loss(case, lp, old, mask, adv, micro_batches):
    eps_low, eps_high = 0.2, case.get("epsilon_high", 0.2)
    rho = torch.exp((lp * mask).sum(1) - (old * mask).sum(1))
    l = -torch.min(rho * adv, torch.clamp(rho, 1 - eps_low, 1 + eps_high) * adv)
    loss = l.mean() / micro_batches
    low = ((rho < 1 - eps_low) & (adv < 0)).double()
    high = ((rho > 1 + eps_high) & (adv > 0)).double()
    region = ((low + high) > 0).double()
    return loss, {"clip_ratio/low_mean": low.mean().item(), "clip_ratio/high_mean": high.mean().item(),
                  "clip_ratio/region_mean": region.mean().item(), "clip_ratio/low_min": low.min().item(),
                  "clip_ratio/high_max": high.max().item()}


def run_case(cfg, W0, case, rloo):
    W = {k: v.clone().requires_grad_(True) for k, v in W0.items()}
    T = case.get("temperature", 1.0)
    logps, ents = token_stats(cfg, W, T)
    width = max(len(c) for _, c in ROWS)
    lp = padded(logps, width)
    ent = padded(ents, width)
    mask = masks(case)
    start = lp.detach()
    old = start + padded([torch.tensor(o, dtype=torch.float64) for o in offsets("old")], width) if case.get("old") else None
    ref = start + padded([torch.tensor(o, dtype=torch.float64) for o in offsets("ref")], width) if case.get("ref") else None
    if rloo:
        adv, frac_zero = rloo_advantages(case, old, ref, mask)
    else:
        adv, frac_zero = grpo_advantages(case)
    num_items = mask.sum().item()
    n_micro = case.get("micro_batches", 1)
    per = len(ROWS) // n_micro
    total, micro_metrics = 0.0, []
    for k in range(n_micro):
        s = slice(k * per, (k + 1) * per)
        if rloo:
            loss, m = rloo_micro_loss(case, lp[s], old[s], mask[s], adv[s], n_micro)
        else:
            loss, m = grpo_micro_loss(case, lp[s], (old if old is not None else lp.detach())[s], None if ref is None else ref[s],
                                      mask[s], adv[s], num_items, n_micro)
        m["entropy"] = ((ent[s] * mask[s]).sum() / mask[s].sum().clamp(min=1.0)).item()
        loss.backward(retain_graph=True)
        total += loss.item()
        micro_metrics.append(m)
    out = {"config": {k: v for k, v in case.items() if k not in ("old", "ref")}, "uses_old": bool(case.get("old")),
           "uses_ref": bool(case.get("ref")),
           "old_logp": [old[i, : len(c)].tolist() for i, (_, c) in enumerate(ROWS)] if old is not None else None,
           "ref_logp": [ref[i, : len(c)].tolist() for i, (_, c) in enumerate(ROWS)] if ref is not None else None,
           "advantages": adv.tolist(), "frac_reward_zero_std": frac_zero, "loss": total,
           "micro_metrics": micro_metrics, "grads": grad_summary(W)}
    return out


def main():
    model_dir, out_path = sys.argv[1], sys.argv[2]
    cfg, W0 = load(model_dir)
    golden = {
        "eos": EOS, "group": G, "prompts": PROMPTS, "rows": ROWS, "max_completion_length": MAX_COMPLETION_LENGTH,
        "rewards": [[None if math.isnan(x) else x for x in r] for r in REWARDS], "reward_weights": WEIGHTS,
        "grpo": [run_case(cfg, W0, c, False) for c in GRPO_CASES],
        "rloo": [run_case(cfg, W0, c, True) for c in RLOO_CASES],
    }
    json.dump(golden, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
