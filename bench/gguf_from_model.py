#!/usr/bin/python3
"""Write a Qwen3 or Qwen3-MoE model folder (config.json + *.safetensors, e.g. from `trl init-model`) as a GGUF file
for llama.cpp, with llama.cpp's own gguf-py, so bench/run_llamacpp.sh and bench/run_moe.sh run both engines on the
same weights. A Qwen3-MoE folder's per-expert tensors are stacked per layer into ffn_{gate,up,down}_exps [E, ...], its
router becomes ffn_gate_inp, as llama.cpp's own converter writes them (arch qwen3moe; llama.cpp renormalises the
top-k weights always, so the model should have norm_topk_prob true, as Qwen3-30B-A3B has).

    PYTHONPATH=LLAMA_CPP_SOURCE/gguf-py /usr/bin/python3 bench/gguf_from_model.py MODEL_DIR OUT.gguf

Matrices are copied as they are stored (bf16 stays BF16, f32 stays F32); norm weights become F32, as llama.cpp's
own converter writes them. The tokenizer is not converted: the file
declares `tokenizer.ggml.model = none` with the model's vocab_size, which is all llama-bench and llama-batched-bench
need (they feed random token ids). Needs numpy (Debian: python3-numpy) and nothing else.
"""
import json
import os
import re
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("gguf_from_model.py: cannot import gguf; put llama.cpp's gguf-py on PYTHONPATH "
             "(PYTHONPATH=LLAMA_CPP_SOURCE/gguf-py)")

# Hugging Face Qwen3 names (after 'model.layers.N.') -> GGUF names (after 'blk.N.').
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
DTYPES = {"BF16": (np.uint16, gguf.GGMLQuantizationType.BF16), "F32": (np.float32, gguf.GGMLQuantizationType.F32),
          "F16": (np.float16, gguf.GGMLQuantizationType.F16)}


EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")


def gguf_name(hf_name):
    if hf_name.endswith(".mlp.gate.weight"):  # a mixture of experts' router
        return f"blk.{hf_name.split('.')[2]}.ffn_gate_inp.weight"
    if hf_name in TOP_NAMES:
        return TOP_NAMES[hf_name]
    parts = hf_name.split(".", 3)
    if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[3] in LAYER_NAMES:
        return f"blk.{parts[2]}.{LAYER_NAMES[parts[3]]}"
    sys.exit(f"gguf_from_model.py: no GGUF name for tensor '{hf_name}'")


def safetensors_tensors(path):
    """Yields (name, numpy array) for every tensor of one .safetensors file (memory-mapped)."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in DTYPES:
            sys.exit(f"gguf_from_model.py: {path}: tensor '{name}' has dtype {info['dtype']}; only BF16, F16, F32")
        begin, end = info["data_offsets"]
        array = data[begin:end].view(DTYPES[info["dtype"]][0]).reshape(info["shape"])
        yield name, array, DTYPES[info["dtype"]][1]


def to_f32(array, qtype):
    if qtype == gguf.GGMLQuantizationType.BF16:
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model_dir, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    moe = cfg.get("model_type") == "qwen3_moe"
    if cfg.get("model_type") not in ("qwen3", "qwen3_moe"):
        sys.exit(f"gguf_from_model.py: {model_dir}/config.json: model_type is {cfg.get('model_type')!r}, not 'qwen3' or 'qwen3_moe'")
    if moe and (cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1):
        sys.exit("gguf_from_model.py: llama.cpp's qwen3moe has every layer sparse (no mlp_only_layers, decoder_sparse_step 1)")
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])

    writer = gguf.GGUFWriter(out + ".tmp", "qwen3moe" if moe else "qwen3")
    writer.add_name("trl.cpp random " + os.path.basename(os.path.normpath(model_dir)))
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(cfg["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_tokenizer_model("none")
    if moe:
        writer.add_expert_count(cfg.get("num_experts", cfg.get("num_local_experts")))
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])

    files = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    if not files:
        sys.exit(f"gguf_from_model.py: no .safetensors file in {model_dir}")
    experts = {}  # (layer, proj) -> {expert: array}: stacked once every expert of the layer is read
    for file in files:
        for name, array, qtype in safetensors_tensors(os.path.join(model_dir, file)):
            m = EXPERT.match(name)
            if m:
                experts.setdefault((int(m.group(1)), m.group(3)), {})[int(m.group(2))] = (array, qtype)
                continue
            if array.ndim == 1:  # norms: llama.cpp multiplies them as F32 (its converter stores them so)
                array, qtype = to_f32(array, qtype), gguf.GGMLQuantizationType.F32
            writer.add_tensor(gguf_name(name), array, raw_dtype=qtype)
    for (layer, proj), parts in sorted(experts.items()):
        stacked = np.stack([parts[e][0] for e in range(len(parts))])
        writer.add_tensor(f"blk.{layer}.ffn_{proj}_exps.weight", stacked, raw_dtype=parts[0][1])
    try:  # written under a temporary name: a failure never leaves a half-written OUT.gguf
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    except BaseException:
        if os.path.exists(out + ".tmp"):
            os.remove(out + ".tmp")
        raise
    os.replace(out + ".tmp", out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
