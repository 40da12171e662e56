#!/usr/bin/python3
"""Goldens for LoRA adapters in PEFT's format (tests/models/lora_test.cpp), from an independent PyTorch implementation
of what PEFT computes: an adapted nn.Linear is x @ W.T + scaling * (x @ A.T) @ B.T (scaling = lora_alpha / r, or
lora_alpha / sqrt(r) with use_rslora), and merging writes W + scaling * B @ A. It reads and writes adapter folders
itself (adapter_config.json + adapter_model.safetensors with PEFT's "base_model.model.<module>.lora_A.weight" names),
on top of qwen3_reference.py's forward pass; it shares no code with trl.cpp.

    /usr/bin/python3 tests/reference/lora_reference.py write-peft MODEL_DIR ADAPTER_DIR
        a PEFT-layout adapter with random A and B (nonzero B) for the tiny model
    /usr/bin/python3 tests/reference/lora_reference.py goldens MODEL_DIR PEFT_ADAPTER_DIR TRL_ADAPTER_DIR OUT.json
        logits of the model with each adapter (merged and unmerged must agree), and 3 SFT AdamW steps that train
        the PEFT adapter's A and B (the base frozen) on qwen3_train_reference.py's batch
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

from qwen3_reference import COLUMNS, SEQUENCES, forward, load_safetensors, run_case
from qwen3_train_reference import ROWS, batch, samples

PREFIX = "base_model.model."
TARGETS = ["q_proj", "v_proj", "up_proj", "down_proj"]  # a subset, so that unadapted modules are exercised too
R, ALPHA = 4, 8
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01


def save_safetensors(path, tensors):
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        raw = tensors[name].detach().float().contiguous().numpy().astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def modules(cfg, targets):
    out = []
    for i in range(cfg["num_hidden_layers"]):
        for m in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]:
            if m.split(".")[-1] in targets:
                out.append(f"model.layers.{i}.{m}")
    return out


def write_peft(model_dir, adapter_dir):
    cfg = json.load(open(f"{model_dir}/config.json"))
    W = load_safetensors(f"{model_dir}/model.safetensors")
    gen = torch.Generator().manual_seed(20261203)
    tensors = {}
    for m in modules(cfg, TARGETS):
        out_f, in_f = W[m + ".weight"].shape
        tensors[PREFIX + m + ".lora_A.weight"] = (torch.rand(R, in_f, generator=gen) * 2 - 1) / math.sqrt(in_f)
        tensors[PREFIX + m + ".lora_B.weight"] = (torch.rand(out_f, R, generator=gen) * 2 - 1) * 0.05
    os.makedirs(adapter_dir, exist_ok=True)
    save_safetensors(f"{adapter_dir}/adapter_model.safetensors", tensors)
    # The keys PEFT 0.17 writes (sorted), including ones trl ignores.
    config = {"alpha_pattern": {}, "auto_mapping": None, "base_model_name_or_path": "tiny-golden", "bias": "none", "corda_config": None,
              "eva_config": None, "exclude_modules": None, "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
              "layer_replication": None, "layers_pattern": None, "layers_to_transform": None, "loftq_config": {}, "lora_alpha": ALPHA,
              "lora_bias": False, "lora_dropout": 0.0, "megatron_config": None, "megatron_core": "megatron.core", "modules_to_save": None,
              "peft_type": "LORA", "qalora_group_size": 16, "r": R, "rank_pattern": {}, "revision": None, "target_modules": TARGETS,
              "target_parameters": None, "task_type": "CAUSAL_LM", "trainable_token_indices": None, "use_dora": False, "use_qalora": False,
              "use_rslora": False}
    with open(f"{adapter_dir}/adapter_config.json", "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    print(f"wrote {adapter_dir}: {len(tensors)} tensors")


def read_adapter(adapter_dir, cfg, W):
    """PEFT's loading, checked: the config's fields, the tensor names, shapes and dtypes."""
    c = json.load(open(f"{adapter_dir}/adapter_config.json"))
    for key in ["peft_type", "r", "lora_alpha", "target_modules", "task_type", "base_model_name_or_path", "bias", "use_rslora"]:
        if key not in c:
            raise SystemExit(f"{adapter_dir}/adapter_config.json: no {key}")
    if c["peft_type"] != "LORA" or c["bias"] != "none" or c.get("use_dora", False):
        raise SystemExit(f"{adapter_dir}: not a plain LoRA adapter")
    with open(f"{adapter_dir}/adapter_model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(n)).get("__metadata__", {})
    if meta.get("format") != "pt":
        raise SystemExit(f"{adapter_dir}/adapter_model.safetensors: metadata format is {meta.get('format')}, PEFT needs pt")
    T = load_safetensors(f"{adapter_dir}/adapter_model.safetensors")
    targets = c["target_modules"]
    mods = modules(cfg, targets)
    r = c["r"]
    want = {}
    for m in mods:
        out_f, in_f = W[m + ".weight"].shape
        want[PREFIX + m + ".lora_A.weight"] = [r, in_f]
        want[PREFIX + m + ".lora_B.weight"] = [out_f, r]
    got = {k: list(v.shape) for k, v in T.items()}
    if got != want:
        raise SystemExit(f"{adapter_dir}: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}, wrong shapes "
                         f"{[k for k in want if k in got and got[k] != want[k]]}")
    scaling = c["lora_alpha"] / (math.sqrt(r) if c["use_rslora"] else r)
    lora = {m: (T[PREFIX + m + ".lora_A.weight"].float(), T[PREFIX + m + ".lora_B.weight"].float()) for m in mods}
    return lora, scaling, c


def merged_weights(W, lora, scaling):
    M = dict(W)
    for m, (A, B) in lora.items():
        M[m + ".weight"] = (W[m + ".weight"].double() + scaling * (B.double() @ A.double())).to(W[m + ".weight"].dtype)
    return M


def unmerged_linear(W, lora, scaling):
    def linear(x, module):
        y = x @ W[module + ".weight"].T
        if module in lora:
            A, B = lora[module]
            y = y + ((x @ A.T) @ B.T) * scaling
        return y
    return linear


def logits_golden(cfg, W, lora, scaling):
    M = merged_weights(W, lora, scaling)
    cases = [run_case(cfg, M, [s], "right", False) for s in SEQUENCES[:3]]
    cases.append(run_case(cfg, M, SEQUENCES[:3], "left", False))
    # The unmerged adapter gives the same logits (the adapter is what PEFT computes, merged or not).
    ids = torch.tensor([SEQUENCES[0]])
    mask = torch.ones_like(ids)
    pos = (mask.cumsum(-1) - 1)
    with torch.no_grad():
        a = forward(cfg, M, ids, mask, pos).double()
        b = forward(cfg, W, ids, mask, pos, unmerged_linear(W, lora, scaling)).double()
    err = (a - b).abs().max().item() / a.abs().max().item()
    if not err < 1e-5:
        raise SystemExit(f"merged and unmerged logits differ by {err}")
    return {"columns": COLUMNS, "cases": cases}


def train_golden(cfg, W, lora, scaling):
    """3 AdamW steps on A and B only (torch.optim.AdamW, weight decay on both), the base frozen; no clipping."""
    params = {}
    for m, (A, B) in lora.items():
        params[m + ".lora_A.weight"] = A.clone().requires_grad_(True)
        params[m + ".lora_B.weight"] = B.clone().requires_grad_(True)
    live = {m: (params[m + ".lora_A.weight"], params[m + ".lora_B.weight"]) for m in lora}
    ids, mask, pos, labels, weights = batch()

    def loss_fn():
        logits = forward(cfg, W, ids, mask, pos, unmerged_linear(W, live, scaling)).float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, labels[..., None])[..., 0]
        return (logp.double() * weights).sum()

    opt = torch.optim.AdamW(list(params.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses, grads = [], None
    for step in range(3):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        if step == 0:
            grads = {n: {"sum": p.grad.double().sum().item(), "sumsq": (p.grad.double() ** 2).sum().item(), "samples": samples(n, p.grad, [])}
                     for n, p in params.items()}
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        final = loss_fn().item()
    after = {n: samples(n, p.detach(), [])[:8] for n, p in params.items()}
    return {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WD, "losses": losses, "final_loss": final, "grads": grads, "params_after": after}


def main():
    torch.set_num_threads(2)
    if sys.argv[1] == "write-peft":
        write_peft(sys.argv[2], sys.argv[3])
        return
    model_dir, peft_dir, trl_dir, out_path = sys.argv[2:6]
    cfg = json.load(open(f"{model_dir}/config.json"))
    W = {k: v.float() for k, v in load_safetensors(f"{model_dir}/model.safetensors").items()}
    peft_lora, peft_scaling, _ = read_adapter(peft_dir, cfg, W)
    trl_lora, trl_scaling, trl_config = read_adapter(trl_dir, cfg, W)
    out = {"peft": logits_golden(cfg, W, peft_lora, peft_scaling), "trl": logits_golden(cfg, W, trl_lora, trl_scaling),
           "trl_adapter_config": trl_config, "trl_adapter_files": sorted(os.listdir(trl_dir)),
           "trl_adapter_samples": {m + ".lora_B.weight": samples(m, B, [])[:8] for m, (A, B) in trl_lora.items()},
           "train": train_golden(cfg, W, peft_lora, peft_scaling), "torch_version": torch.__version__}
    out["train"]["rows"] = ROWS
    with open(out_path, "w") as f:
        json.dump(out, f)
    print(f"wrote {out_path}: losses {[round(x, 6) for x in out['train']['losses']]}")


if __name__ == "__main__":
    main()
