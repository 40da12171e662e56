#!/usr/bin/env bash
# One training step of trl.cpp (`trl bench train`) beside the same step in PyTorch (bench/train_torch.py), same
# shapes and dtype, and the ratio. Arguments are passed to both, e.g.:
#   bash bench/run_train.sh --preset qwen3-0.6b --layers 4 --batch 1 --seq 512 --dtype bf16 --steps 3
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
cmake --build "$build" --target trl >/dev/null
ours=$("$build/trl" bench train "$@")
echo "$ours"
theirs=$(/usr/bin/python3 "$root/bench/train_torch.py" "$@")
echo "$theirs"
/usr/bin/python3 - "$ours" "$theirs" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"bench": "ratio_train_vs_torch", "speedup": b["step_seconds_best"] / a["step_seconds_best"],
                  "mfu": a["mfu"], "rss_ratio": a["peak_rss_mb"] / b["peak_rss_mb"]}))
PY
