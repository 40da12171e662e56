#!/usr/bin/env bash
# Builds the fuzz targets and runs each for SECONDS (default 60) on 1 job, starting from its seed corpus
# fuzz/corpus/NAME (and the findings kept there). New inputs go to a temporary corpus, not the tree; a finding stops
# the run with libFuzzer's report and leaves the input as crash-*/leak-*/timeout-*/oom-* in $PWD.
#   bash fuzz/run.sh [SECONDS] [TARGET ...] [-- extra libFuzzer flags...]
# TARGET: parquet (the default), safetensors, config, tokenizer, jinja, dataset, yaml, checkpoint, serve, or all.
# The build is the project's sanitizer build made with clang and TRL_FUZZ=ON (fuzz/targets.cmake): the library with
# ASan, UBSan and libFuzzer's coverage, and a target per parser linking it. TRL_FUZZ_BUILD names the folder (default
# build-fuzz); scripts/test.sh points it at its sanitizer build, which has the targets already, so nothing is
# configured or compiled again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
targets=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do targets+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#targets[@]} -eq 0 ] && targets=(parquet)
[ "${targets[0]}" = "all" ] && targets=(parquet safetensors config tokenizer jinja dataset yaml checkpoint serve)
build=${TRL_FUZZ_BUILD:-$root/build-fuzz}
if ! grep -qx 'TRL_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  # The flags of scripts/test.sh's sanitizer build, without the tests and benchmarks.
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DTRL_SANITIZE=ON \
    -DTRL_FUZZ=ON -DTRL_UNITY_BUILD=ON -DTRL_BUILD_TESTS=OFF -DTRL_BUILD_BENCH=OFF >/dev/null
fi
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
