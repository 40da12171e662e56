"""Goldens for LoRA on a mixture of experts from PEFT itself (PyPI's peft, transformers and PyTorch, on the CPU): an
adapter on tests/data/moe/topk_norm (made by qwen3_moe_reference.py) that targets q_proj as a module and, as PEFT's
target_parameters, the router (mlp.gate.weight) and both stacked expert parameters (mlp.experts.gate_up_proj,
mlp.experts.down_proj). Its lora_B are random (init_lora_weights=False), so the adapter changes the model. Written:
the adapter folder as PEFT saves it, and the loss, aux loss, logits and every adapter tensor's gradient of the
adapted model on the golden batch, and the logits of PEFT's merge_and_unload(). tests/models/moe_lora_test.cpp
compares.

    python tests/reference/qwen3_moe_lora_reference.py MOE_DATA_DIR GOLDEN_JSON
      # MOE_DATA_DIR: tests/data/moe (reads topk_norm/, writes lora_topk_norm/); GOLDEN_JSON: the goldens file
"""
import json
import os
import sys

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import Qwen3MoeForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen3_moe_reference import ROWS, batch  # noqa: E402  the same golden batch

TARGET_PARAMETERS = ["mlp.gate.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def logits_of(out):
    logits = out.logits.detach().double()
    return [[logits[b, t].tolist() for t in range(len(r))] for b, r in enumerate(ROWS)]


def main():
    data_dir, golden = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    base = Qwen3MoeForCausalLM.from_pretrained(os.path.join(data_dir, "topk_norm"), dtype=torch.float32).eval()
    torch.manual_seed(21)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj"], target_parameters=TARGET_PARAMETERS,
                        init_lora_weights=False)
    model = get_peft_model(base, config)
    with torch.no_grad():  # the default init of lora_B would be as large as lora_A: keep the adapter a modest change
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.mul_(0.3)
    out_dir = os.path.join(data_dir, "lora_topk_norm")
    model.save_pretrained(out_dir)
    cfg_path = os.path.join(out_dir, "adapter_config.json")
    with open(cfg_path) as f:  # the base as tests load it, not this machine's path
        cfg = json.load(f)
    cfg["base_model_name_or_path"] = "../topk_norm"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    os.remove(os.path.join(out_dir, "README.md"))  # PEFT's model card template: not test data

    ids, mask, labels = batch()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    grads = {}
    for n, p in model.named_parameters():
        if p.requires_grad:
            name = n.replace(".default", "")  # the file's names
            g = p.grad.double()
            grads[name] = {"shape": list(p.shape), "sum": g.sum().item(), "sumsq": (g * g).sum().item(),
                           "values": g.reshape(-1).tolist()}
    result = {
        "peft_version": peft.__version__, "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "rows": ROWS, "loss": out.loss.item(), "aux_loss": out.aux_loss.item(), "logits": logits_of(out), "grads": grads,
    }
    with torch.no_grad():
        merged = model.merge_and_unload()
        result["merged_logits"] = logits_of(merged(input_ids=ids, attention_mask=mask))
    with open(golden, "w") as f:
        json.dump(result, f)
    print(f"loss {result['loss']:.6f} aux {result['aux_loss']:.6f}; {len(grads)} adapter tensors -> {out_dir}, {golden}")


if __name__ == "__main__":
    main()
