#!/usr/bin/env bash
# Tokenizer throughput and load time, trl.cpp beside Hugging Face's tokenizers (the npm package, Node bindings of
# the Rust library), on the same corpus (tests/data/tokenizer/corpus.jsonl, 1.17 MB), one thread each.
#   bash bench/run_tokenizer.sh [build-dir]      (needs node and `npm install tokenizers` in tests/reference/)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
cmake --build "$build" --target trl_bench_tokenizer trl >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/trl" init-model --preset tiny --out "$tmp/m" >/dev/null
ours=$("$build/bench/trl_bench_tokenizer" "$tmp/m" "$root/tests/data/tokenizer/corpus.jsonl")
echo "$ours"
if [ -d "$root/tests/reference/node_modules/tokenizers" ]; then
  theirs=$(cd "$root/tests/reference" && RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false taskset -c 0 node tokenizer_ids.js --bench)
  echo "$theirs"
  node -e '
    const a = JSON.parse(process.argv[1]), b = JSON.parse(process.argv[2]);
    console.log(JSON.stringify({bench: "ratio_tokenizer_vs_hf", encode_speedup_best: a.best_MB_per_s / b.MB_per_s,
                                encode_speedup_cold: a.cold_MB_per_s / b.MB_per_s,
                                encode_speedup_vs_hf_batch: a.best_MB_per_s / b.batch_MB_per_s, load_speedup: b.load_ms / a.load_ms}));' "$ours" "$theirs"
fi
