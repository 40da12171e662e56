#!/usr/bin/python3
"""Golden training step for the C++ autodiff and AdamW: loss and every parameter gradient of the Qwen3 SFT loss on a
padded batch, then the losses of 5 AdamW steps. Uses the independent forward pass of qwen3_reference.py and
PyTorch's autograd and torch.optim.AdamW. For a bf16 checkpoint the model runs in bf16 (as a bf16 Transformers
model trains: bf16 activations and bf16 gradients) and only the loss and gradients are written.

    /usr/bin/python3 tests/reference/qwen3_train_reference.py MODEL_DIR OUT.json
"""
import json
import sys

import torch

from qwen3_reference import forward, load_safetensors

# Right-padded batch: rows of different lengths; labels are the next tokens, the loss covers real tokens only.
ROWS = [[785, 8585, 49041, 7506, 5302, 13], [151644, 872, 198, 9707], [11, 220, 15, 16, 17, 18, 19]]
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01


def batch():
    B, T = len(ROWS), max(len(r) for r in ROWS)
    ids = torch.zeros(B, T, dtype=torch.int64)
    mask = torch.zeros(B, T, dtype=torch.int64)
    labels = torch.zeros(B, T, dtype=torch.int64)
    weights = torch.zeros(B, T, dtype=torch.float64)
    for b, r in enumerate(ROWS):
        ids[b, :len(r)] = torch.tensor(r)
        mask[b, :len(r)] = 1
        labels[b, :len(r) - 1] = torch.tensor(r[1:])
    n_items = sum(len(r) - 1 for r in ROWS)
    for b, r in enumerate(ROWS):
        weights[b, :len(r) - 1] = -1.0 / n_items  # loss = -Σ log p / num_items_in_batch
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return ids, mask, pos, labels, weights


def loss_fn(cfg, W, ids, mask, pos, labels, weights):
    logits = forward(cfg, W, ids, mask, pos).float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, labels[..., None])[..., 0]
    return (logp.double() * weights).sum()


def samples(name, g, used_ids):
    flat = g.reshape(-1).double()
    n = flat.numel()
    gen = torch.Generator().manual_seed(len(name))
    idx = sorted(set([0, 1, n // 7, n // 3, n // 2, n - 1] + torch.randint(0, n, (24,), generator=gen).tolist()))
    if name == "model.embed_tokens.weight":
        C = g.shape[1]
        idx = sorted(set(idx + [i * C + c for i in used_ids for c in range(0, C, max(1, C // 4))]))
    return [[i, flat[i].item()] for i in idx]


def main():
    model_dir, out_path = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    cfg = json.load(open(f"{model_dir}/config.json"))
    raw = load_safetensors(f"{model_dir}/model.safetensors")
    bf16 = raw["model.embed_tokens.weight"].dtype == torch.bfloat16
    W = {k: (v.clone() if bf16 else v.float().clone()).requires_grad_(True) for k, v in raw.items()}
    ids, mask, pos, labels, weights = batch()
    loss = loss_fn(cfg, W, ids, mask, pos, labels, weights)
    loss.backward()
    used = sorted(set(ids.reshape(-1).tolist()))
    grads = {}
    for name, p in W.items():
        g = p.grad.double()
        grads[name] = {"sum": g.sum().item(), "sumsq": (g * g).sum().item(), "samples": samples(name, p.grad, used)}
    if bf16:
        out = {"rows": ROWS, "dtype": "bf16", "loss": loss.item(), "grads": grads, "torch_version": torch.__version__}
        json.dump(out, open(out_path, "w"))
        print(f"wrote {out_path}: bf16 loss {loss.item():.6f}")
        return
    # 5 AdamW steps on the same batch; weight decay on matrices only (norm weights are excluded, as in Transformers).
    for p in W.values():
        p.grad = None
    decay = [p for n, p in W.items() if "norm" not in n]
    no_decay = [p for n, p in W.items() if "norm" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        l = loss_fn(cfg, W, ids, mask, pos, labels, weights)
        l.backward()
        opt.step()
        losses.append(l.item())
    final = loss_fn(cfg, W, ids, mask, pos, labels, weights).item()
    after = {n: samples(n, p.detach(), used)[:8] for n, p in W.items()}
    out = {"rows": ROWS, "loss": loss.item(), "grads": grads, "adamw": {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WD,
                                                                          "losses": losses, "final_loss": final, "params_after": after},
           "torch_version": torch.__version__}
    json.dump(out, open(out_path, "w"))
    print(f"wrote {out_path}: loss {loss.item():.6f}, adamw losses {[round(x, 6) for x in losses]}")


if __name__ == "__main__":
    main()
