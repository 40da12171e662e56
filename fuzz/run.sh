#!/usr/bin/env bash
# Builds the Parquet fuzz target with clang and runs it for SECONDS (default 60) on 1 job, starting from the seed
# corpus fuzz/corpus/parquet (the test fixtures' files). New inputs go to a temporary corpus, not the tree; a
# finding stops the run with libFuzzer's report and leaves the input as crash-*/leak-*/timeout-*/oom-* in $PWD.
#   bash fuzz/run.sh [SECONDS] [extra libFuzzer flags...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
build=${TRL_FUZZ_BUILD:-$root/build-fuzz}
cmake -S "$root/fuzz" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$root"/fuzz/corpus/parquet/* "$work/"
# -rss_limit_mb: the reader's limits keep it far below; -timeout: no input may take 10 s.
"$build/parquet_fuzz" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 "$@" "$work"
