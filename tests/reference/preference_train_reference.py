#!/usr/bin/python3
"""Goldens for the preference trainers on the tiny model (tests/train/preference_golden_test.cpp): 3 optimizer steps
of DPO (every loss_type), KTO (with its KL term) and a reward model, each step's loss, TRL's metrics and the
gradient norm, every parameter's gradient at step 1 (its norms, sum and 8 entries), the reward model's trained head
and its rewards, computed with the independent forward pass of qwen3_reference.py, the loss formulas of
preference_loss_reference.py, torch.autograd and torch.optim.AdamW, in float32.

The run the C++ test repeats: pre-tokenized rows, per_device_train_batch_size 2, train_sampling_strategy
sequential, learning_rate 1e-3 (constant), AdamW eps 1e-8 without weight decay, no clipping, the reference a frozen
copy of the starting weights.

    /usr/bin/python3 tests/reference/preference_train_reference.py MODEL_DIR OUT.json
"""
import json
import sys

import torch
import torch.nn.functional as F

from preference_loss_reference import loss_of
from qwen3_reference import forward, load_safetensors

LR, STEPS, BATCH = 1e-3, 3, 2
# prompt ids, chosen ids, rejected ids (ids below 1000: none is the pad token)
PAIRS = [
    ([785, 8585, 49041 % 1000, 7], [5302, 13, 11], [220, 15]),
    ([151 % 1000, 872, 198], [9707, 0], [16, 17, 18, 19]),
    ([11, 220, 15], [16, 17], [42, 43, 44]),
    ([300, 301], [302, 303, 304, 305], [306]),
]
DPO_CASES = [
    {"loss_type": [t], "beta": 0.1, "label_smoothing": ls}
    for t, ls in [("sigmoid", 0.0), ("hinge", 0.0), ("ipo", 0.0), ("exo_pair", 1e-3), ("nca_pair", 0.0), ("robust", 0.1),
                  ("bco_pair", 0.0), ("sppo_hard", 0.0), ("aot", 0.1), ("aot_unpaired", 0.05), ("apo_zero", 0.0),
                  ("apo_down", 0.0), ("discopop", 0.0), ("sft", 0.0), ("sigmoid_norm", 0.0)]
]
DPO_CASES += [{"loss_type": ["sigmoid"], "beta": 0.5, "f_divergence_type": "js_divergence"}]
DPO_CASES += [{"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.5], "beta": 0.2}]
DPO_CASES += [{"loss_type": ["sigmoid"], "beta": 0.1, "ld_alpha": 0.5}, {"loss_type": ["ipo"], "beta": 0.1, "ld_alpha": 0.0}]
# TR-DPO: after every optimizer step the reference becomes α·policy + (1 − α)·reference.
DPO_CASES += [{"loss_type": ["sigmoid"], "beta": 0.5, "sync_ref_model": True, "ref_model_mixup_alpha": 0.5, "ref_model_sync_steps": 1}]
# prompt ids, completion ids, desirable
KTO_ROWS = [([785, 8585], [5302, 13], True), ([11, 220], [15, 16, 17], False), ([300, 301, 302], [303], True),
            ([151, 872], [198, 42], False)]
KTO_CASE = {"loss_type": "kto", "beta": 0.5, "desirable_weight": 1.0, "undesirable_weight": 1.0}


def load(model_dir):
    cfg = json.load(open(f"{model_dir}/config.json"))
    raw = load_safetensors(f"{model_dir}/model.safetensors")
    return cfg, {k: v.float().clone() for k, v in raw.items()}


def run(cfg, W, ids):
    """Logits [T, V] of one unpadded sequence."""
    t = torch.tensor([ids])
    return forward(cfg, W, t, torch.ones_like(t), torch.arange(len(ids))[None]).float()[0]


def completion_stats(cfg, W, prompt, completion, shared=None, ld_alpha=1.0):
    """Σ log p over the completion tokens, and their entropies, argmax matches and mean logits over the vocabulary
    (summed over the completion tokens). With `shared`, the log-probs of the completion tokens after the first
    `shared` count ld_alpha times (LD-DPO)."""
    ids = prompt + completion
    logits = run(cfg, W, ids)
    lp = torch.log_softmax(logits, dim=-1)
    at = torch.arange(len(prompt) - 1, len(ids) - 1)
    target = torch.tensor(completion)
    per_token = lp[at, target]
    if shared is not None:
        per_token = per_token * torch.tensor([1.0 if k < shared else ld_alpha for k in range(len(completion))])
    logp = per_token.sum()
    ent = -(lp[at].exp() * lp[at]).sum(-1).sum()
    match = (logits[at].argmax(-1) == target).float().sum()
    mean_logit = logits[at].double().mean(-1).sum()
    return logp, ent.detach(), match.detach(), mean_logit.detach()


def adamw(W):
    return torch.optim.AdamW(list(W.values()), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)


def grad_norm(W):
    return torch.sqrt(sum((p.grad.double() ** 2).sum() for p in W.values() if p.grad is not None)).item()


def grad_summary(W):
    """Each parameter's gradient as its L2 norm, its sum, its L1 norm and 8 evenly spaced entries."""
    out = {}
    for name, p in W.items():
        g = p.grad.double().flatten()
        n = g.numel()
        out[name] = {"norm": g.norm().item(), "sum": g.sum().item(), "abs_sum": g.abs().sum().item(),
                     "at": [k * n // 8 for k in range(8)], "values": [g[k * n // 8].item() for k in range(8)]}
    return out


def dpo_case(cfg, W0, case):
    W = {k: v.clone().requires_grad_(True) for k, v in W0.items()}
    W_ref = {k: v.clone() for k, v in W0.items()}
    opt = adamw(W)
    steps = []
    ld = case.get("ld_alpha")

    def logp_of(weights, p, completion, other):
        return completion_stats(cfg, weights, p, completion, min(len(completion), len(other)) if ld is not None else None, ld or 0.0)

    def reference():
        with torch.no_grad():
            return [(logp_of(W_ref, p, c, r)[0].double(), logp_of(W_ref, p, r, c)[0].double()) for p, c, r in PAIRS]

    ref = reference()
    grads = None
    for s in range(STEPS):
        idx = [(s * BATCH + k) % len(PAIRS) for k in range(BATCH)]
        opt.zero_grad()
        cs, rs, ent, match, ntok, nchosen, logit_c, logit_r = [], [], 0.0, 0.0, 0, 0, 0.0, 0.0
        for i in idx:
            p, c, r = PAIRS[i]
            lc, ec, mc, gc = logp_of(W, p, c, r)
            lr_, er, _, gr = logp_of(W, p, r, c)
            cs.append(lc), rs.append(lr_)
            ent += ec.item() + er.item()
            match += mc.item()
            logit_c += gc.item()
            logit_r += gr.item()
            ntok += len(c) + len(r)
            nchosen += len(c)
        c = torch.stack(cs).double()
        r = torch.stack(rs).double()
        rc = torch.stack([ref[i][0] for i in idx])
        rr = torch.stack([ref[i][1] for i in idx])
        nc = torch.tensor([len(PAIRS[i][1]) for i in idx], dtype=torch.float64)
        nr = torch.tensor([len(PAIRS[i][2]) for i in idx], dtype=torch.float64)
        loss = loss_of(case, c, r, rc, rr, nc, nr)
        loss.backward()
        beta = case["beta"]
        dc, dr = (c - rc).detach(), (r - rr).detach()
        steps.append({"loss": loss.item(), "grad_norm": grad_norm(W), "entropy": ent / ntok, "mean_token_accuracy": match / nchosen,
                      "rewards/chosen": (beta * dc).mean().item(), "rewards/rejected": (beta * dr).mean().item(),
                      "rewards/accuracies": (beta * dc > beta * dr).double().mean().item(),
                      "rewards/margins": (beta * (dc - dr)).mean().item(),
                      "logps/chosen": c.mean().item(), "logps/rejected": r.mean().item(),
                      "logits/chosen": logit_c / nchosen, "logits/rejected": logit_r / (ntok - nchosen)})
        if s == 0:
            grads = grad_summary(W)
        opt.step()
        if case.get("sync_ref_model") and (s + 1) % case["ref_model_sync_steps"] == 0:
            a = case["ref_model_mixup_alpha"]
            with torch.no_grad():
                for k in W_ref:
                    W_ref[k] = a * W[k].detach() + (1 - a) * W_ref[k]
            ref = reference()
    return {"config": case, "steps": steps, "grads_step1": grads}


def kto_run(cfg, W0):
    W = {k: v.clone().requires_grad_(True) for k, v in W0.items()}
    opt = adamw(W)
    beta = KTO_CASE["beta"]
    n = len(KTO_ROWS)
    # The KL row of i: its prompt with the completion of the previous row in its batch (the first takes the last).
    kl_src = []
    for start in range(0, n, BATCH):
        end = min(n, start + BATCH)
        kl_src += [end - 1 if i == start else i - 1 for i in range(start, end)]
    with torch.no_grad():
        ref = [completion_stats(cfg, W0, p, c)[0].double() for p, c, _ in KTO_ROWS]
        ref_kl = [completion_stats(cfg, W0, KTO_ROWS[i][0], KTO_ROWS[kl_src[i]][1])[0].double() for i in range(n)]
    steps = []
    for s in range(STEPS):
        idx = [(s * BATCH + k) % n for k in range(BATCH)]
        opt.zero_grad()
        with torch.no_grad():
            pol_kl = torch.stack([completion_stats(cfg, W, KTO_ROWS[i][0], KTO_ROWS[kl_src[i]][1])[0].double() for i in idx])
        kl = (pol_kl - torch.stack([ref_kl[i] for i in idx])).mean().clamp(min=0)
        stats = [completion_stats(cfg, W, KTO_ROWS[i][0], KTO_ROWS[i][1]) for i in idx]
        logp = torch.stack([x[0] for x in stats]).double()
        ratio = logp - torch.stack([ref[i] for i in idx])
        des = torch.tensor([KTO_ROWS[i][2] for i in idx])
        chosen = 1 - torch.sigmoid(beta * (ratio[des] - kl))
        rejected = 1 - torch.sigmoid(beta * (kl - ratio[~des]))
        loss = torch.cat((KTO_CASE["desirable_weight"] * chosen, KTO_CASE["undesirable_weight"] * rejected)).mean()
        loss.backward()
        ent = sum(x[1].item() for x in stats) / sum(len(KTO_ROWS[i][1]) for i in idx)
        e = {"loss": loss.item(), "grad_norm": grad_norm(W), "kl": kl.item(), "entropy": ent}
        for key, want in (("logits/chosen", True), ("logits/rejected", False)):
            rows = [k for k, i in enumerate(idx) if KTO_ROWS[i][2] == want]
            if rows:
                e[key] = sum(stats[k][3].item() for k in rows) / sum(len(KTO_ROWS[idx[k]][1]) for k in rows)
        r = (beta * ratio).detach()
        if des.any():
            e["rewards/chosen"] = r[des].mean().item()
            e["logps/chosen"] = logp[des].mean().item()
        if (~des).any():
            e["rewards/rejected"] = r[~des].mean().item()
            e["logps/rejected"] = logp[~des].mean().item()
        if des.any() and (~des).any():
            e["rewards/margins"] = e["rewards/chosen"] - e["rewards/rejected"]
        steps.append(e)
        if s == 0:
            grads = grad_summary(W)
        opt.step()
    return {"config": KTO_CASE, "rows": [[p, c, d] for p, c, d in KTO_ROWS], "steps": steps, "grads_step1": grads}


def score_head(C):
    return torch.tensor([[0.05 * ((c * 7) % 13 - 6) for c in range(C)]], dtype=torch.float32)


def reward_run(cfg, W0):
    C = cfg["hidden_size"]
    W = {k: v.clone().requires_grad_(True) for k, v in W0.items() if k != "lm_head.weight"}
    W["score.weight"] = score_head(C).requires_grad_(True)
    opt = adamw(W)

    def reward(ids):
        Wh = dict(W)
        Wh["lm_head.weight"] = W["score.weight"]  # h @ score.T: the reward at every position
        cfg_h = dict(cfg, tie_word_embeddings=False)
        t = torch.tensor([ids])
        return forward(cfg_h, Wh, t, torch.ones_like(t), torch.arange(len(ids))[None])[0, -1, 0].double()

    steps = []
    for s in range(STEPS):
        idx = [(s * BATCH + k) % len(PAIRS) for k in range(BATCH)]
        opt.zero_grad()
        rc = torch.stack([reward(PAIRS[i][0] + PAIRS[i][1]) for i in idx])
        rr = torch.stack([reward(PAIRS[i][0] + PAIRS[i][2]) for i in idx])
        loss = -F.logsigmoid(rc - rr).mean() + 0.01 * torch.mean((rc + rr) ** 2)
        loss.backward()
        allr = torch.cat((rc, rr)).detach()
        steps.append({"loss": loss.item(), "grad_norm": grad_norm(W), "min_reward": allr.min().item(), "mean_reward": allr.mean().item(),
                      "max_reward": allr.max().item(), "accuracy": (rc > rr).double().mean().item(), "margin": (rc - rr).mean().item()})
        if s == 0:
            grads = grad_summary(W)
        opt.step()
    # The trained head as saved (score.weight [1, C]) and the rewards of the trained model on every pair.
    with torch.no_grad():
        final = [[reward(p + c).item(), reward(p + r).item()] for p, c, r in PAIRS]
    return {"center_rewards_coefficient": 0.01, "steps": steps, "grads_step1": grads,
            "score_weight": W["score.weight"].detach()[0].tolist(), "final_rewards": final}


def main():
    model_dir, out_path = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    torch.manual_seed(0)
    cfg, W0 = load(model_dir)
    out = {"pairs": [[p, c, r] for p, c, r in PAIRS], "lr": LR, "batch": BATCH,
           "dpo": [dpo_case(cfg, W0, case) for case in DPO_CASES], "kto": kto_run(cfg, W0), "reward": reward_run(cfg, W0),
           "torch_version": torch.__version__}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {out_path}: {len(out['dpo'])} DPO cases, KTO, reward")


if __name__ == "__main__":
    main()
