#!/usr/bin/env bash
# Serving throughput and latency of `trl serve` beside llama.cpp's llama-server on the same machine, the same random
# Qwen3 weights (bf16) and the same thread count: for 1, 8 and 32 concurrent clients, each engine is started with as
# many slots as clients, warmed up, and loaded by bench/serve_load.py (streamed /v1/completions, token-id prompts,
# ignore_eos and greedy, so both do the same work). Engines alternate per figure; one JSON line per run, then a table.
#
#   bash bench/run_serve.sh LLAMA_SERVER MODEL_DIR MODEL_GGUF [--clients "1 8 32"] [--prompt_tokens 128] [--max_tokens 64] [--runs 1]
#
# MODEL_DIR: `trl init-model --preset qwen3-0.6b --dtype bf16 --out MODEL_DIR`; MODEL_GGUF: the same folder written
# by llama.cpp's convert_hf_to_gguf.py (`--outtype bf16`; it needs transformers and sentencepiece in its Python).
# LLAMA_SERVER: llama.cpp's build/bin/llama-server. Nothing else may run on the machine meanwhile.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
[[ $# -ge 3 ]] || { sed -n '7,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
llama=$1 model=$2 gguf=$3
shift 3
clients="1 8 32" prompt=128 new=64 runs=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --clients) clients=$2; shift 2 ;;
    --prompt_tokens) prompt=$2; shift 2 ;;
    --max_tokens) new=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    *) echo "run_serve.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $llama ]] || { echo "run_serve.sh: $llama is not an executable (llama.cpp's llama-server)" >&2; exit 2; }
[[ -f $model/config.json ]] || { echo "run_serve.sh: $model is not a model folder" >&2; exit 2; }
[[ -f $gguf ]] || { echo "run_serve.sh: no GGUF file $gguf" >&2; exit 2; }
threads=${OMP_NUM_THREADS:-$(nproc)}
port=18400
len=$(( (prompt + new + 63) / 64 * 64 + 64 ))  # a row's slots: the prompt in whole chunks of 64, then the new tokens
out=${OUT:-/tmp/run_serve.jsonl}
: >"$out"

wait_ready() {  # GET /health until 200
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "run_serve.sh: the server on port $port did not become ready" >&2
  return 1
}

run_one() {  # ENGINE CLIENTS
  local engine=$1 c=$2 pid
  if [[ $engine == trl ]]; then
    "$build/trl" serve --model "$model" --port "$port" --max_batch "$c" --max_model_len "$len" --max_queue 256 2>/tmp/run_serve.$engine.log &
  else
    "$llama" -m "$gguf" --port "$port" -t "$threads" -tb "$threads" -np "$c" -c $(( c * len )) -b 512 -ub 512 --no-webui \
      2>/tmp/run_serve.$engine.log >&2 &
  fi
  pid=$!
  wait_ready
  # Warm-up: every batch size the run will meet compiles (trl) or allocates (llama.cpp) before the clock starts.
  python3 "$root/bench/serve_load.py" --url "http://127.0.0.1:$port" --clients "$c" --requests "$c" --prompt_tokens "$prompt" \
    --max_tokens 8 --seed 99 >/dev/null
  python3 "$root/bench/serve_load.py" --url "http://127.0.0.1:$port" --clients "$c" --requests $(( c * 2 > 4 ? c * 2 : 4 )) \
    --prompt_tokens "$prompt" --max_tokens "$new" --label "$engine" | tee -a "$out"
  kill -TERM "$pid"
  wait "$pid" || true
  port=$((port + 1))
}

for c in $clients; do
  for r in $(seq "$runs"); do
    run_one trl "$c"
    run_one llama "$c"
  done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| clients | trl serve tok/s | llama-server tok/s | ratio | TTFT median trl / llama (s) | per-client decode trl / llama (tok/s) |")
print("|---|---|---|---|---|---|")
for c in sorted({r["clients"] for r in rows}):
    t = [r for r in rows if r["clients"] == c and r["label"] == "trl"]
    l = [r for r in rows if r["clients"] == c and r["label"] == "llama"]
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    print(f"| {c} | {med(t, 'tokens_per_s'):.1f} | {med(l, 'tokens_per_s'):.1f} | {med(t, 'tokens_per_s') / med(l, 'tokens_per_s'):.2f}x | "
          f"{med(t, 'ttft_median_s'):.2f} / {med(l, 'ttft_median_s'):.2f} | {med(t, 'per_client_decode_tok_s'):.1f} / {med(l, 'per_client_decode_tok_s'):.1f} |")
PY
