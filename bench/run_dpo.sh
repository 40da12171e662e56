#!/usr/bin/env bash
# One DPO step of trl.cpp (`trl bench dpo`) beside the same step in PyTorch (bench/dpo_torch.py), same shapes and
# dtype, and the ratio. Arguments are passed to both, e.g.:
#   bash bench/run_dpo.sh --preset qwen3-0.6b --layers 4 --pairs 2 --seq 512 --dtype bf16 --steps 3 [--precompute_ref_log_probs]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
cmake --build "$build" --target trl >/dev/null
ours=$("$build/trl" bench dpo "$@")
echo "$ours"
theirs=$(/usr/bin/python3 "$root/bench/dpo_torch.py" "$@")
echo "$theirs"
/usr/bin/python3 - "$ours" "$theirs" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"bench": "ratio_dpo_vs_torch", "speedup": b["step_seconds_best"] / a["step_seconds_best"],
                  "rss_ratio": a["peak_rss_mb"] / b["peak_rss_mb"]}))
PY
