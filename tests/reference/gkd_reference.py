#!/usr/bin/python3
"""Goldens for distillation (tests/train/gkd_test.cpp): TRL's generalized JSD between a tiny student and a tiny
teacher of another depth, written from TRL's GKDTrainer.generalized_jsd_loss (trl/experimental/gkd/gkd_trainer.py:
log_softmax of logits / T, F.kl_div with log targets, the log-space mixture for 0 < beta < 1, summed over the
vocabulary and over the completion tokens, divided by the number of completion tokens of the batch) with the
independent forward pass of qwen3_reference.py in float32 (each row unpadded, positions from 0) and torch.autograd.

  - "gkd": 3 AdamW steps of GKD with lmbda 0 (the dataset's completions) for beta 0.5, 0 and 1: the loss and the
    clipped gradient norm of each step, and the step-1 gradient of every parameter.
  - "divergence": one batch's loss and gradients for a loss temperature (the DistillationTrainer's), beta 1 at
    T 0.7 and beta 0.3 at T 2.
  - "self": the loss with the student as its own teacher (exactly 0 at any beta).

    /usr/bin/python3 tests/reference/gkd_reference.py STUDENT_DIR TEACHER_DIR OUT.json
"""
import json
import sys

import torch
import torch.nn.functional as F

from preference_train_reference import grad_norm, grad_summary
from qwen3_reference import forward, load_safetensors

LR, STEPS, BATCH, MAX_GRAD_NORM = 1e-3, 3, 2, 1.0
# (prompt ids, completion ids) of 5 rows, taken in order in batches of 2: the epoch's last batch has row 4 alone
# (Transformers' dataloader keeps a short last batch).
ROWS = [([785, 8585, 49], [5302, 13, 11, 151645]), ([11, 220], [15, 16, 17, 18, 19]), ([300, 301, 302, 303], [304, 151645]),
        ([9707], [42, 43, 44]), ([151, 872, 198, 27], [2610, 525, 264, 10950, 151645])]


def load(model_dir):
    cfg = json.load(open(f"{model_dir}/config.json"))
    raw = load_safetensors(f"{model_dir}/model.safetensors")
    return cfg, {k: v.float().clone() for k, v in raw.items()}


def completion_logits(cfg, W, prompt, completion):
    """The logits at the positions that predict the completion tokens [len(completion), V]."""
    ids = prompt + completion
    t = torch.tensor([ids])
    logits = forward(cfg, W, t, torch.ones_like(t), torch.arange(len(ids))[None]).float()[0]
    return logits[len(prompt) - 1: len(ids) - 1]


def generalized_jsd(student_logits, teacher_logits, beta, temperature):
    """TRL's per-token generalized JSD, summed over the vocabulary: [N] for [N, V] logits."""
    s = F.log_softmax(student_logits / temperature, dim=-1)
    t = F.log_softmax(teacher_logits / temperature, dim=-1)
    if beta == 0:
        jsd = F.kl_div(s, t, reduction="none", log_target=True)
    elif beta == 1:
        jsd = F.kl_div(t, s, reduction="none", log_target=True)
    else:
        b = torch.tensor(beta, dtype=s.dtype)
        m = torch.logsumexp(torch.stack([s + torch.log1p(-b), t + torch.log(b)]), dim=0)
        jsd = b * F.kl_div(m, t, reduction="none", log_target=True) + (1 - b) * F.kl_div(m, s, reduction="none", log_target=True)
    return jsd.sum(-1)


def batch_loss(cfg, W, tcfg, T, idx, beta, temperature):
    total, items = 0.0, 0
    for i in idx:
        p, c = ROWS[i]
        with torch.no_grad():
            tl = completion_logits(tcfg, T, p, c)
        total = total + generalized_jsd(completion_logits(cfg, W, p, c), tl, beta, temperature).double().sum()
        items += len(c)
    return total / items


def gkd_run(cfg, W0, tcfg, T, beta):
    W = {k: v.clone().requires_grad_(True) for k, v in W0.items()}
    opt = torch.optim.AdamW(list(W.values()), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    steps, grads = [], None
    for s in range(STEPS):
        idx = list(range(s * BATCH, min(len(ROWS), (s + 1) * BATCH)))
        opt.zero_grad()
        loss = batch_loss(cfg, W, tcfg, T, idx, beta, 1.0)
        loss.backward()
        norm = grad_norm(W)
        if s == 0:
            grads = grad_summary(W)
        torch.nn.utils.clip_grad_norm_(list(W.values()), MAX_GRAD_NORM)
        opt.step()
        steps.append({"loss": loss.item(), "grad_norm": norm})
    return {"beta": beta, "steps": steps, "grads_step1": grads}


def divergence(cfg, W0, tcfg, T, beta, temperature):
    W = {k: v.clone().requires_grad_(True) for k, v in W0.items()}
    loss = batch_loss(cfg, W, tcfg, T, [0, 1], beta, temperature)
    loss.backward()
    return {"beta": beta, "temperature": temperature, "loss": loss.item(), "grads": grad_summary(W)}


def main():
    student_dir, teacher_dir, out = sys.argv[1:4]
    cfg, W = load(student_dir)
    tcfg, T = load(teacher_dir)
    with torch.no_grad():
        self_losses = {str(b): batch_loss(cfg, W, cfg, W, [0, 1, 2], b, 1.0).item() for b in (0.0, 0.5, 1.0)}
    g = {"rows": [[p, c] for p, c in ROWS], "lr": LR, "batch": BATCH, "max_grad_norm": MAX_GRAD_NORM,
         "gkd": [gkd_run(cfg, W, tcfg, T, b) for b in (0.5, 0.0, 1.0)],
         "divergence": [divergence(cfg, W, tcfg, T, 1.0, 0.7), divergence(cfg, W, tcfg, T, 0.3, 2.0)],
         "self": self_losses}
    with open(out, "w") as f:
        json.dump(g, f)


if __name__ == "__main__":
    main()
