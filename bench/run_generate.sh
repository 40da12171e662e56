#!/usr/bin/env bash
# Generation speed of trl.cpp (`trl bench generate`) beside the same prefill and decode in PyTorch
# (bench/generate_torch.py), same shapes and dtype, and the ratios. Arguments are passed to both, e.g.:
#   bash bench/run_generate.sh --preset qwen3-0.6b --dtype bf16 --batch 8 --prompt_len 512 --new_tokens 64
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
cmake --build "$build" --target trl >/dev/null
ours=$("$build/trl" bench generate "$@")
echo "$ours"
theirs=$(/usr/bin/python3 "$root/bench/generate_torch.py" "$@")
echo "$theirs"
/usr/bin/python3 - "$ours" "$theirs" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"bench": "ratio_generate_vs_torch",
                  "prefill": a["prefill_tokens_per_s"] / b["prefill_tokens_per_s"],
                  "decode_batch1": a["decode_tokens_per_s_batch1"] / b["decode_tokens_per_s_batch1"],
                  "decode_batchN": a["decode_tokens_per_s_batchN"] / b["decode_tokens_per_s_batchN"],
                  "batch1_fraction_of_bandwidth_bound": a["batch1_fraction_of_bound"]}))
PY
