#!/usr/bin/python3
"""Goldens for src/train/losses/: every DPO loss_type (and every f_divergence_type under the sigmoid loss) on a
fixed batch of pairs, KTO (both loss types, with and without a KL term) and the reward model's Bradley-Terry loss
(with margins and centring), each with the gradient of the loss with respect to the policy's sequence log-probs
(or the rewards) from torch.autograd, in float64. The formulas are those of TRL's DPOTrainer, KTOTrainer and
RewardTrainer (docs/TRAINING.md).

    /usr/bin/python3 tests/reference/preference_loss_reference.py tests/data/goldens/preference_losses.json
"""
import json
import sys

import torch
import torch.nn.functional as F

# chosen, rejected, ref_chosen, ref_rejected, chosen_tokens, rejected_tokens
PAIRS = [
    (-12.5, -15.25, -13.0, -14.0, 7, 9),
    (-30.0, -22.0, -29.5, -23.5, 18, 11),
    (-4.75, -9.5, -5.0, -9.0, 3, 6),
    (-55.0, -54.0, -52.0, -57.0, 31, 29),
]
CASES = [
    {"loss_type": [t], "beta": 0.1, "label_smoothing": ls}
    for t, ls in [("sigmoid", 0.0), ("hinge", 0.0), ("ipo", 0.0), ("exo_pair", 1e-3), ("nca_pair", 0.0), ("robust", 0.1),
                  ("bco_pair", 0.0), ("sppo_hard", 0.0), ("aot", 0.1), ("aot_unpaired", 0.05), ("apo_zero", 0.0),
                  ("apo_down", 0.0), ("discopop", 0.0), ("sft", 0.0), ("sigmoid_norm", 0.0)]
]
CASES += [{"loss_type": ["sigmoid"], "beta": 0.5, "f_divergence_type": f, "f_alpha_divergence_coef": 0.5}
          for f in ["forward_kl", "js_divergence", "alpha_divergence"]]
CASES += [{"loss_type": ["sigmoid", "sft", "ipo"], "loss_weights": [0.8, 0.2, 1.5], "beta": 0.25}]
CASES += [{"loss_type": ["hinge"], "beta": 2.0}]  # some pairs past the hinge: zero gradient there


def score(logratio, case):
    f = case.get("f_divergence_type", "reverse_kl")
    if f == "reverse_kl":
        return logratio
    if f == "forward_kl":
        return -torch.exp(-logratio)
    if f == "js_divergence":
        return F.logsigmoid(logratio)
    a = case.get("f_alpha_divergence_coef", 0.5)
    return torch.exp(torch.clamp((a - 1.0) * logratio, max=80.0)) / (a - 1.0)


def loss_of(case, c, r, rc, rr, nc, nr):
    beta, eps = case["beta"], case.get("label_smoothing", 0.0)
    dc, dr = c - rc, r - rr
    sc, sr = score(dc, case), score(dr, case)
    d = sc - sr
    total = torch.zeros((), dtype=torch.float64)
    weights = case.get("loss_weights", [1.0] * len(case["loss_type"]))
    for t, w in zip(case["loss_type"], weights):
        if t == "sigmoid":
            per = -F.logsigmoid(beta * d)
        elif t == "hinge":
            per = torch.relu(1 - beta * d)
        elif t == "ipo":
            per = (sc / nc.clamp(min=1) - sr / nr.clamp(min=1) - 1 / (2 * beta)) ** 2
        elif t == "exo_pair":
            e = torch.tensor(eps, dtype=torch.float64)
            per = torch.sigmoid(beta * d) * (F.logsigmoid(beta * d) - torch.log1p(-e)) + \
                torch.sigmoid(-beta * d) * (F.logsigmoid(-beta * d) - torch.log(e))
        elif t == "nca_pair":
            per = -F.logsigmoid(beta * sc) - 0.5 * F.logsigmoid(-beta * sc) - 0.5 * F.logsigmoid(-beta * sr)
        elif t == "robust":
            per = (-(1 - eps) * F.logsigmoid(beta * d) + eps * F.logsigmoid(-beta * d)) / (1 - 2 * eps)
        elif t == "bco_pair":
            per = -F.logsigmoid(beta * sc) - F.logsigmoid(-beta * sr)
        elif t == "sppo_hard":
            per = (sc - 0.5 / beta) ** 2 + (sr + 0.5 / beta) ** 2
        elif t in ("aot", "aot_unpaired"):
            a, b = (c - r, rc - rr) if t == "aot" else (dc, dr)
            delta = torch.sort(a, dim=0)[0] - torch.sort(b, dim=0)[0]
            per = -F.logsigmoid(beta * delta) * (1 - eps) - F.logsigmoid(-beta * delta) * eps
        elif t == "apo_zero":
            per = (1 - torch.sigmoid(beta * dc)) + torch.sigmoid(beta * dr)
        elif t == "apo_down":
            per = torch.sigmoid(beta * dc) + (1 - torch.sigmoid(beta * d))
        elif t == "discopop":
            lg = beta * d
            mod = torch.sigmoid(lg / case.get("discopop_tau", 0.05))
            per = -F.logsigmoid(lg) * (1 - mod) + torch.exp(-lg) * mod
        elif t == "sft":
            per = (-c.sum() / nc.sum().clamp(min=1)).expand(c.shape[0])
        elif t == "sigmoid_norm":
            per = -F.logsigmoid(beta * (sc / nc.clamp(min=1) - sr / nr.clamp(min=1)))
        else:
            raise ValueError(t)
        total = total + per.mean() * w
    return total


# logp, ref_logp, desirable
KTO_ROWS = [(-12.0, -12.5, True), (-20.0, -18.0, False), (-7.5, -9.0, True), (-33.0, -31.0, False), (-14.0, -13.0, True)]
KTO_CASES = [
    {"loss_type": "kto", "beta": 0.1, "desirable_weight": 1.0, "undesirable_weight": 1.0, "kl": 0.0},
    {"loss_type": "kto", "beta": 0.5, "desirable_weight": 1.33, "undesirable_weight": 0.8, "kl": 0.75},
    {"loss_type": "apo_zero_unpaired", "beta": 0.2, "desirable_weight": 1.0, "undesirable_weight": 2.0, "kl": 0.0},
]
# chosen reward, rejected reward, margin
REWARD_PAIRS = [(1.5, -0.5, 0.0), (0.25, 0.75, 0.5), (-2.0, -3.5, 1.0)]
REWARD_CASES = [{"center_rewards_coefficient": None}, {"center_rewards_coefficient": 0.01}]


def kto(case):
    logp = torch.tensor([r[0] for r in KTO_ROWS], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([r[1] for r in KTO_ROWS], dtype=torch.float64)
    des = torch.tensor([r[2] for r in KTO_ROWS])
    ratio = logp - ref
    beta, kl = case["beta"], torch.tensor(case["kl"], dtype=torch.float64)
    if case["loss_type"] == "kto":
        chosen = 1 - torch.sigmoid(beta * (ratio[des] - kl))
        rejected = 1 - torch.sigmoid(beta * (kl - ratio[~des]))
    else:
        chosen = 1 - torch.sigmoid(beta * ratio[des])
        rejected = torch.sigmoid(beta * ratio[~des])
    loss = torch.cat((case["desirable_weight"] * chosen, case["undesirable_weight"] * rejected)).nanmean()
    loss.backward()
    return {"config": case, "loss": loss.item(), "d_logp": logp.grad.tolist()}


def reward(case):
    rc = torch.tensor([p[0] for p in REWARD_PAIRS], dtype=torch.float64, requires_grad=True)
    rr = torch.tensor([p[1] for p in REWARD_PAIRS], dtype=torch.float64, requires_grad=True)
    margin = torch.tensor([p[2] for p in REWARD_PAIRS], dtype=torch.float64)
    loss = -F.logsigmoid(rc - rr - margin).mean()
    if case["center_rewards_coefficient"] is not None:
        loss = loss + case["center_rewards_coefficient"] * torch.mean((rc + rr) ** 2)
    loss.backward()
    return {"config": case, "loss": loss.item(), "d_chosen": rc.grad.tolist(), "d_rejected": rr.grad.tolist()}


def main():
    cols = list(zip(*PAIRS))
    out = {"pairs": [list(p) for p in PAIRS], "cases": []}
    for case in CASES:
        c = torch.tensor(cols[0], dtype=torch.float64, requires_grad=True)
        r = torch.tensor(cols[1], dtype=torch.float64, requires_grad=True)
        rc, rr = torch.tensor(cols[2], dtype=torch.float64), torch.tensor(cols[3], dtype=torch.float64)
        nc, nr = torch.tensor(cols[4], dtype=torch.float64), torch.tensor(cols[5], dtype=torch.float64)
        loss = loss_of(case, c, r, rc, rr, nc, nr)
        loss.backward()
        grad = lambda x: (x.grad if x.grad is not None else torch.zeros_like(x)).tolist()  # noqa: E731 (sft: no rejected term)
        out["cases"].append({"config": case, "loss": loss.item(), "d_chosen": grad(c), "d_rejected": grad(r)})
    result = {
        "dpo": out,
        "kto": {"rows": [list(r) for r in KTO_ROWS], "cases": [kto(c) for c in KTO_CASES]},
        "reward": {"pairs": [list(p) for p in REWARD_PAIRS], "cases": [reward(c) for c in REWARD_CASES]},
    }
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
