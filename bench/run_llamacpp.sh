#!/usr/bin/env bash
# Prefill and decode speed of trl.cpp beside llama.cpp on the same machine, same shapes, same dtype (bf16), same
# thread count: runs alternate (ours, llama.cpp, ours, ...) so a drift of the machine's memory bandwidth hits both,
# and the table reports medians and their ratios. llama.cpp is optional: the project never needs it.
#
#   bash bench/run_llamacpp.sh LLAMA_CPP_DIR [--runs 3] [--preset qwen3-0.6b] [--threads N]
#
# LLAMA_CPP_DIR is a llama.cpp source tree with llama-bench and llama-batched-bench built in build/bin (or set
# LLAMA_BIN to their folder), e.g.
#   cmake -S LLAMA_CPP_DIR -B LLAMA_CPP_DIR/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_OPENMP=ON
#   cmake --build LLAMA_CPP_DIR/build --target llama-bench llama-batched-bench
# The model: `trl init-model` random bf16 weights of the preset, written as GGUF by bench/gguf_from_model.py with
# llama.cpp's own gguf-py (needs python3-numpy); `trl bench generate` builds the same shapes in memory.
# Figures (tokens/s): prefill of one 512-token prompt; decode of batch 1 and batch 8 after a 16-token prompt
# (ours: `trl bench generate --batch 8 --prompt_len 512 --new_tokens 32`; llama.cpp: `llama-bench -p 512 -n 0`,
# `llama-batched-bench -npp 16 -ntg 32 -npl 1,8`). Prints one JSON line per run and per engine, then the table.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}

usage() { sed -n '6,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[[ $# -ge 1 ]] || usage
llama=$(cd "$1" && pwd) || { echo "run_llamacpp.sh: no folder $1" >&2; exit 2; }
shift
runs=3 preset=qwen3-0.6b threads=${OMP_NUM_THREADS:-$(nproc)}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs | --preset | --threads)
      [[ $# -ge 2 ]] || { echo "run_llamacpp.sh: $1 needs a value" >&2; usage; }
      case "$1" in --runs) runs=$2 ;; --preset) preset=$2 ;; --threads) threads=$2 ;; esac
      shift 2 ;;
    *) echo "run_llamacpp.sh: unknown option $1" >&2; usage ;;
  esac
done
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "run_llamacpp.sh: --runs must be a positive integer, not '$runs'" >&2; exit 2; }
[[ $threads =~ ^[1-9][0-9]*$ ]] || { echo "run_llamacpp.sh: --threads must be a positive integer, not '$threads'" >&2; exit 2; }
bin=${LLAMA_BIN:-$llama/build/bin}
for tool in llama-bench llama-batched-bench; do
  [[ -x $bin/$tool ]] || { echo "run_llamacpp.sh: $bin/$tool is missing: build llama.cpp first (see the top of this script)" >&2; exit 2; }
done
[[ -d $llama/gguf-py ]] || { echo "run_llamacpp.sh: $llama/gguf-py is missing: LLAMA_CPP_DIR must be llama.cpp's source tree" >&2; exit 2; }
if [[ -n ${OMP_WAIT_POLICY:-} ]]; then
  echo "run_llamacpp.sh: OMP_WAIT_POLICY=$OMP_WAIT_POLICY is set; unset it (PASSIVE halves batch-1 decode)" >&2
  exit 2
fi

cmake --build "$build" --target trl >/dev/null
work=${WORK:-/tmp/trl-llamacpp-$preset}
mkdir -p "$work"
if [[ ! -f $work/model.gguf ]]; then
  "$build/trl" init-model --preset "$preset" --dtype bf16 --out "$work/model" >/dev/null
  PYTHONPATH=$llama/gguf-py /usr/bin/python3 "$root/bench/gguf_from_model.py" "$work/model" "$work/model.gguf"
fi

results=$work/results.jsonl
: >"$results"
# Runs one engine's command; its JSON lines go to the results (tagged with the engine), its stderr to a log that is
# shown when it fails.
run_engine() {
  local engine=$1 log=$work/$1.log out
  shift
  if ! out=$("$@" 2>"$log"); then
    echo "run_llamacpp.sh: $engine failed ($*); its output:" >&2
    cat "$log" >&2
    exit 1
  fi
  out=$(grep '^{' <<<"$out" || true)
  [[ -n $out ]] || { echo "run_llamacpp.sh: $engine printed no JSON line ($*); see $log" >&2; exit 1; }
  sed "s/^{/{\"engine\":\"$engine\",/" <<<"$out" | tee -a "$results"
}
for ((r = 1; r <= runs; ++r)); do
  run_engine trl env OMP_NUM_THREADS="$threads" "$build/trl" bench generate --preset "$preset" --batch 8 --prompt_len 512 --new_tokens 32
  run_engine llama-bench "$bin/llama-bench" -m "$work/model.gguf" -p 512 -n 0 -t "$threads" -r 2 -o jsonl
  run_engine llama-batched-bench "$bin/llama-batched-bench" -m "$work/model.gguf" -c 2048 -b 512 -ub 512 -npp 16 -ntg 32 -npl 1,8 \
    -t "$threads" --output-format jsonl
done

/usr/bin/python3 - "$results" "$threads" <<'PY'
import json, statistics, sys
ours, pp, tg = [], [], {1: [], 8: []}
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("bench") == "generate":
        ours.append(j)
    elif j.get("engine") == "llama-bench" and j.get("n_prompt") == 512 and j.get("n_gen") == 0:
        pp.append(j["avg_ts"])
    elif j.get("engine") == "llama-batched-bench" and j.get("pl") in tg:
        tg[j["pl"]].append(j["speed_tg"])
if not ours or not pp or not tg[1] or not tg[8]:
    sys.exit("run_llamacpp.sh: a run printed no figures (see the JSON lines above)")
med = statistics.median
rows = [("prefill 512 tokens", med([o["prefill_tokens_per_s"] for o in ours]), med(pp)),
        ("decode batch 1", med([o["decode_tokens_per_s_batch1"] for o in ours]), med(tg[1])),
        ("decode batch 8", med([o["decode_tokens_per_s_batchN"] for o in ours]), med(tg[8]))]
print(f"medians of {len(ours)} alternating runs, {sys.argv[2]} threads, tokens/s")
print(f"{'':22}{'trl.cpp':>10}{'llama.cpp':>11}{'ratio':>8}")
for name, a, b in rows:
    print(f"{name:22}{a:10.1f}{b:11.1f}{a / b:8.2f}")
print(f"decode batch 1 vs the bandwidth bound (trl bench generate): "
      f"{med([o['batch1_fraction_of_bound'] for o in ours]):.2f} "
      f"(read bandwidth {med([o['read_bandwidth_gb_s'] for o in ours]):.1f} GB/s)")
PY
