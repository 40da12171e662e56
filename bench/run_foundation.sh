#!/usr/bin/env bash
# Runs the foundation benchmark and, when Debian's python3-torch is present, the same forward pass in PyTorch,
# and prints the ratios. Figures go to docs/PERFORMANCE.md with this command.
#   bash bench/run_foundation.sh [build-dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
cmake --build "$build" --target trl_bench_foundation >/dev/null
ours=$("$build/bench/trl_bench_foundation")
echo "$ours"
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  theirs=$(/usr/bin/python3 "$root/bench/foundation_torch.py")
  echo "$theirs"
  /usr/bin/python3 - "$ours" "$theirs" <<'PY'
import json, sys
ours = [json.loads(l) for l in sys.argv[1].splitlines()]
theirs = {j["preset"]: j for j in map(json.loads, sys.argv[2].splitlines())}
for j in ours:
    if j["bench"] == "reference_forward":
        t = theirs[j["preset"]]
        print(json.dumps({"bench": "ratio_reference_vs_torch_eager", "preset": j["preset"],
                          "torch_ms": t["ms"], "reference_ms": j["ms"], "reference_time_over_torch": j["ms"] / t["ms"]}))
PY
fi
