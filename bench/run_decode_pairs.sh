#!/usr/bin/env bash
# Batch-1 decode in alternating pairs, with each pair's ratio: on a machine whose memory bandwidth drifts from
# minute to minute (the 2-core VMs do, by up to 1.5x), a ratio of two separate runs says little; the median of
# many pair ratios, and the range, say more.
#
#   bash bench/run_decode_pairs.sh LLAMA_CPP_DIR [--preset qwen3-0.6b] [--layers 0] [--pairs 8]
#   bash bench/run_decode_pairs.sh --ab TRL_A TRL_B [--preset qwen3-0.6b] [--layers 0] [--pairs 8]
#
# First form: `trl bench generate --batch 1 --prompt_len 64 --new_tokens 32` then llama.cpp's
#   `llama-batched-bench -npp 16 -ntg 32 -npl 1` on the same random weights (`trl init-model`, written as GGUF by
#   bench/gguf_from_model.py with llama.cpp's gguf-py; PYTHON needs numpy), in turn.
# Second form: two trl binaries (say a build before and after a change), `trl bench generate --batch 1
#   --prompt_len 16 --new_tokens 64`, A then B.
# --layers 0 keeps the preset's depth. Prints one JSON line per run, then the medians and the pair ratios (second
# over first engine).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
python=${PYTHON:-python3}
usage() { sed -n '6,7p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 ]] || usage
mode=llama
if [[ $1 == --ab ]]; then
  [[ $# -ge 3 ]] || usage
  mode=ab a=$2 b=$3
  shift 3
  for t in "$a" "$b"; do [[ -x $t ]] || { echo "run_decode_pairs.sh: $t is not an executable trl" >&2; exit 2; }; done
else
  llama=$(cd "$1" 2>/dev/null && pwd) || { echo "run_decode_pairs.sh: no folder $1" >&2; exit 2; }
  shift
fi
preset=qwen3-0.6b layers=0 pairs=8
while [[ $# -gt 0 ]]; do
  [[ $# -ge 2 ]] || { echo "run_decode_pairs.sh: $1 needs a value" >&2; usage; }
  case "$1" in
    --preset) preset=$2 ;; --layers) layers=$2 ;; --pairs) pairs=$2 ;;
    *) echo "run_decode_pairs.sh: unknown option $1" >&2; usage ;;
  esac
  shift 2
done
if [[ -n ${OMP_WAIT_POLICY:-} ]]; then echo "run_decode_pairs.sh: unset OMP_WAIT_POLICY (PASSIVE halves batch-1 decode)" >&2; exit 2; fi
depth=()
[[ $layers -gt 0 ]] && depth=(--layers "$layers")
results=$(mktemp)
trap 'rm -f "$results"' EXIT
tag() { grep '^{' | sed "s/^{/{\"engine\":\"$1\",/" | tee -a "$results"; }

if [[ $mode == ab ]]; then
  for ((r = 1; r <= pairs; ++r)); do
    "$a" bench generate --preset "$preset" "${depth[@]}" --batch 1 --prompt_len 16 --new_tokens 64 | tag A
    "$b" bench generate --preset "$preset" "${depth[@]}" --batch 1 --prompt_len 16 --new_tokens 64 | tag B
  done
else
  bin=${LLAMA_BIN:-$llama/build/bin}
  [[ -x $bin/llama-batched-bench ]] || { echo "run_decode_pairs.sh: $bin/llama-batched-bench is missing: build llama.cpp first (bench/run_llamacpp.sh says how)" >&2; exit 2; }
  cmake --build "$build" --target trl >/dev/null
  work=${WORK:-/tmp/trl-decode-$preset-$layers}
  mkdir -p "$work"
  if [[ ! -f $work/model.gguf ]]; then
    "$build/trl" init-model --preset "$preset" "${depth[@]}" --dtype bf16 --out "$work/model" >/dev/null
    PYTHONPATH=$llama/gguf-py "$python" "$root/bench/gguf_from_model.py" "$work/model" "$work/model.gguf"
  fi
  for ((r = 1; r <= pairs; ++r)); do
    "$build/trl" bench generate --preset "$preset" "${depth[@]}" --batch 1 --prompt_len 64 --new_tokens 32 | tag A
    "$bin/llama-batched-bench" -m "$work/model.gguf" -c 1024 -b 512 -ub 512 -npp 16 -ntg 32 -npl 1 -t "$(nproc)" --output-format jsonl 2>/dev/null |
      tag B
  done
fi
python3 - "$results" "$mode" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rate = lambda r: r["decode_tokens_per_s_batch1"] if "decode_tokens_per_s_batch1" in r else r["speed_tg"]
a = [rate(r) for r in rows if r["engine"] == "A"]
b = [rate(r) for r in rows if r["engine"] == "B"]
names = ("trl A", "trl B") if sys.argv[2] == "ab" else ("llama.cpp", "trl.cpp")
# Ratios are trl.cpp over llama.cpp in the first form, B over A in the second.
num, den = (b, a) if sys.argv[2] == "ab" else (a, b)
ratios = sorted(x / y for x, y in zip(num, den))
mb = next((r["weight_mb_per_token"] for r in rows if "weight_mb_per_token" in r), 0)
m = statistics.median
print(json.dumps({"bench": "decode_pairs", "pairs": len(ratios), "mb_per_token": mb,
                  names[0] + " tok/s": [round(x, 1) for x in (den if sys.argv[2] != "ab" else a)],
                  names[1] + " tok/s": [round(x, 1) for x in (num if sys.argv[2] != "ab" else b)],
                  "median_pair_ratio": round(m(ratios), 3), "ratio_range": [round(ratios[0], 2), round(ratios[-1], 2)],
                  "ratio_of_medians": round(m(num) / m(den), 3)}))
PY
