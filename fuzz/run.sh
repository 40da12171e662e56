#!/usr/bin/env bash
# Builds fuzz targets with clang and runs each for SECONDS (default 60) on 1 job, starting from its seed corpus
# fuzz/corpus/NAME (and the findings kept there). New inputs go to a temporary corpus, not the tree; a finding stops
# the run with libFuzzer's report and leaves the input as crash-*/leak-*/timeout-*/oom-* in $PWD.
#   bash fuzz/run.sh [SECONDS] [TARGET ...] [-- extra libFuzzer flags...]
# TARGET: parquet (the default), safetensors, config, tokenizer, jinja, dataset, yaml, checkpoint, or all. Every
# target but parquet links the library, built once in the fuzz build with the sanitizers (a few minutes).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
targets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do targets+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#targets[@]} -eq 0 ] && targets=(parquet)
[ "${targets[0]}" = "all" ] && targets=(parquet safetensors config tokenizer jinja dataset yaml checkpoint)
build=${TRL_FUZZ_BUILD:-$root/build-fuzz}
library=OFF  # the targets but parquet link the library, built here with clang (it needs libomp-dev)
for t in "${targets[@]}"; do [ "$t" != parquet ] && library=ON; done
cmake -S "$root/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTRL_FUZZ_LIBRARY=$library >/dev/null
cmake --build "$build" --target $(printf '%s_fuzz ' "${targets[@]}")
for t in "${targets[@]}"; do
  work=$(mktemp -d) scratch=$(mktemp -d)  # the corpus; the files a target writes to read them back
  cp "$root"/fuzz/corpus/"$t"/* "$work/"
  echo "== $t: $seconds s from $(ls "$work" | wc -l) seeds"
  # -rss_limit_mb: the readers' limits keep them far below; -timeout: no input may take 10 s.
  TMPDIR="$scratch" "$build/${t}_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 "$@" "$work" ||
    { rm -rf "$work" "$scratch"; exit 1; }
  rm -rf "$work" "$scratch"
done
