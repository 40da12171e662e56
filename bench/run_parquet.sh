#!/usr/bin/env bash
# Parquet read speed and streaming memory, trl.cpp beside hyparquet (the npm reader) on the same ~100 MB
# conversational file (92,000 Capybara-shaped rows, 10 row groups, SNAPPY), alternating runs, 3 each, one thread each.
#   bash bench/run_parquet.sh [build-dir]
# Needs node and, in tests/reference/, `npm install --no-save hyparquet@1.33.0 hyparquet-writer@0.17.0
# hyparquet-compressors@1.1.2 @dsnp/parquetjs@1.8.8` (the file is written by hyparquet-writer on first use).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
file=${TRL_PARQUET_BENCH_FILE:-/tmp/trl-capybara-100mb.parquet}
cmake --build "$build" --target trl_bench_parquet >/dev/null
cd "$root/tests/reference"
[ -f "$file" ] || node parquet_fixtures.mjs --big "$file"
ours=() theirs=()
for i in 1 2 3; do
  ours+=("$(taskset -c 0 "$build/bench/trl_bench_parquet" "$file")")
  theirs+=("$(taskset -c 0 node parquet_fixtures.mjs --read "$file")")
done
printf '%s\n' "${ours[@]}" "${theirs[@]}"
node -e '
  const rows = process.argv.slice(1).map(JSON.parse);
  const med = (xs) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)];
  const a = med(rows.filter(r => r.reader === "trl.cpp").map(r => r.seconds));
  const b = med(rows.filter(r => r.reader === "hyparquet").map(r => r.seconds));
  const t = rows.find(r => r.reader === "trl.cpp");
  console.log(JSON.stringify({bench: "parquet_read", trl_seconds_median: a, hyparquet_seconds_median: b, speedup: b / a,
    trl_mb_per_s: t.mb_per_s * t.seconds / a, trl_rows_per_s: t.rows / a, peak_rss_growth_mb: t.peak_rss_growth_mb,
    largest_row_group_mb: t.largest_row_group_mb, peak_over_row_group: t.peak_rss_growth_mb / t.largest_row_group_mb}));' "${ours[@]}" "${theirs[@]}"
