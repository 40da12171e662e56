"""PyTorch side of bench/run_moe.sh: the training step of `trl bench train --preset qwen3-30b-a3b` (Qwen3-MoE widths,
random weights, SFT cross-entropy on random tokens plus the load-balancing loss at the config's 0.001, backward,
AdamW) with Transformers' own Qwen3MoeForCausalLM (PyPI's transformers and PyTorch, CPU). The configuration is the
fastest of those tried here: --experts_implementation grouped_mm (torch's grouped GEMM; the default, as eager, a
Python loop over the experts, took 51-116 s a step here: its indexing of the fused expert tensors makes a gradient
of the whole tensor per expert) and --precision bf16_weights (the default: the model in bf16 with AdamW on bf16
weights, as a bf16 checkpoint trains; autocast, f32 weights under torch.autocast(bfloat16), took 5.5 s against
2.6 s; f32). Prints one JSON line.

    python bench/moe_torch.py --layers 1 --batch 1 --seq 512 --dtype bf16 --vocab_size 8192 --steps 3
"""
import argparse
import json
import resource
import time

import torch
import transformers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--vocab_size", type=int, default=151936)
    ap.add_argument("--experts_implementation", default="grouped_mm")
    ap.add_argument("--precision", default="bf16_weights", help="bf16_weights: the model in bf16 (no f32 masters); autocast: f32 weights under "
                    "torch.autocast(bfloat16); f32")
    args, _ = ap.parse_known_args()
    if args.preset != "qwen3-30b-a3b":
        raise SystemExit("moe_torch.py: only --preset qwen3-30b-a3b")
    torch.set_num_threads(torch.get_num_threads())
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=args.vocab_size, hidden_size=2048, intermediate_size=6144, num_hidden_layers=args.layers,
                         num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                         moe_intermediate_size=768, norm_topk_prob=True, router_aux_loss_coef=0.001, output_router_logits=True,
                         tie_word_embeddings=False, max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    try:
        cfg._experts_implementation = args.experts_implementation
    except Exception:
        pass
    model = Qwen3MoeForCausalLM(cfg).float().train()
    if args.dtype == "bf16" and args.precision == "bf16_weights":
        model = model.to(torch.bfloat16)
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(args.experts_implementation)
    B, T = args.batch, args.seq
    ids = torch.randint(0, min(args.vocab_size, 151643), (B, T))
    mask = torch.ones(B, T, dtype=torch.long)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=True)
    bf16 = args.dtype == "bf16" and args.precision == "autocast"

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=ids, attention_mask=mask, labels=ids)
        out.loss.backward()
        opt.step()
        return out.loss.item(), out.aux_loss.item()

    step()  # warm-up
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss, aux = step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({
        "bench": "train_torch_moe", "preset": args.preset, "layers": args.layers, "vocab_size": args.vocab_size, "dtype": args.dtype,
        "batch": B, "seq": T, "threads": torch.get_num_threads(), "experts_implementation": args.experts_implementation, "precision": args.precision,
        "torch": torch.__version__, "transformers": transformers.__version__, "parameters": sum(p.numel() for p in model.parameters()),
        "step_seconds_best": min(times), "step_seconds_mean": sum(times) / len(times), "tokens_per_s": B * T / min(times),
        "loss": loss, "aux_loss": aux, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


if __name__ == "__main__":
    main()
