#!/usr/bin/env bash
# Qwen3-MoE (Qwen3-30B-A3B's widths at a reduced depth, bf16) on trl.cpp beside its baselines on the same machine:
#   training: `trl bench train --preset qwen3-30b-a3b` against Transformers' own Qwen3MoeForCausalLM on PyPI's
#     PyTorch (bench/moe_torch.py, run with PYTHON, a venv with transformers and torch), the same step (cross-entropy
#     plus the load-balancing loss, backward, AdamW), alternating runs, median ratio;
#   decode: `trl bench generate --preset qwen3-30b-a3b` batch 1 against llama.cpp's llama-batched-bench on the same
#     random weights written as GGUF (bench/gguf_from_model.py), alternating runs, median ratio.
#
#   PYTHON=/path/to/venv/bin/python bash bench/run_moe.sh LLAMA_CPP_DIR [--runs 3] [--layers 1] [--decode_layers 4]
#       [--seq 512] [--vocab_size 8192]
#
# --vocab_size cuts the training step's vocabulary (both sides): one layer of the full model holds 0.6 billion expert
# weights, and with the 151936-row embedding and head its f32 masters, moments and gradients pass 24 GB. Decode uses
# the whole vocabulary. LLAMA_CPP_DIR: a llama.cpp source tree with llama-batched-bench built (see run_llamacpp.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
python=${PYTHON:-python3}
[[ $# -ge 1 ]] || { sed -n '9,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
llama=$(cd "$1" && pwd) || { echo "run_moe.sh: no folder $1" >&2; exit 2; }
shift
runs=3 layers=1 decode_layers=4 seq=512 vocab=8192
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || { echo "run_moe.sh: $1 needs a value" >&2; exit 2; }
  case "$1" in
    --runs) runs=$2 ;; --layers) layers=$2 ;; --decode_layers) decode_layers=$2 ;; --seq) seq=$2 ;; --vocab_size) vocab=$2 ;;
    *) echo "run_moe.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
bin=${LLAMA_BIN:-$llama/build/bin}
[[ -x $bin/llama-batched-bench ]] || { echo "run_moe.sh: $bin/llama-batched-bench is missing: build llama.cpp first" >&2; exit 2; }
if [[ -n ${OMP_WAIT_POLICY:-} ]]; then echo "run_moe.sh: unset OMP_WAIT_POLICY (PASSIVE halves batch-1 decode)" >&2; exit 2; fi
cmake --build "$build" --target trl >/dev/null
work=${WORK:-/tmp/trl-moe-$decode_layers}
mkdir -p "$work"
if [[ ! -f $work/model.gguf ]]; then
  "$build/trl" init-model --preset qwen3-30b-a3b --layers "$decode_layers" --dtype bf16 --out "$work/model" >/dev/null
  PYTHONPATH=$llama/gguf-py "$python" "$root/bench/gguf_from_model.py" "$work/model" "$work/model.gguf"
fi
results=$work/results.jsonl
: >"$results"
tag() { grep '^{' | sed "s/^{/{\"engine\":\"$1\",/" | tee -a "$results"; }
for ((r = 1; r <= runs; ++r)); do
  "$build/trl" bench train --preset qwen3-30b-a3b --layers "$layers" --batch 1 --seq "$seq" --dtype bf16 --vocab_size "$vocab" --steps 2 | tag trl
  "$python" "$root/bench/moe_torch.py" --layers "$layers" --batch 1 --seq "$seq" --dtype bf16 --vocab_size "$vocab" --steps 2 | tag torch
  "$build/trl" bench generate --preset qwen3-30b-a3b --layers "$decode_layers" --batch 1 --prompt_len 64 --new_tokens 32 | tag trl
  "$bin/llama-batched-bench" -m "$work/model.gguf" -c 1024 -b 512 -ub 512 -npp 16 -ntg 32 -npl 1 -t "$(nproc)" --output-format jsonl 2>/dev/null |
    tag llama.cpp
done
"$python" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ours_t = [r["step_seconds_best"] for r in rows if r["engine"] == "trl" and r.get("bench") == "train"]
torch_t = [r["step_seconds_best"] for r in rows if r["engine"] == "torch"]
ours_d = [r["decode_tokens_per_s_batch1"] for r in rows if r["engine"] == "trl" and r.get("bench") == "generate"]
llama_d = [r["speed_tg"] for r in rows if r["engine"] == "llama.cpp" and r.get("pl") == 1]
m = statistics.median
print(json.dumps({"bench": "moe_vs_baselines", "train_step_s": m(ours_t), "torch_step_s": m(torch_t), "train_speedup": m(torch_t) / m(ours_t),
                  "decode_tok_s": m(ours_d), "llama_tok_s": m(llama_d), "decode_ratio": m(ours_d) / m(llama_d)}))
PY
