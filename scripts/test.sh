#!/usr/bin/env bash
# Builds trl.cpp and runs every test: a Release build with warnings as errors, a short fuzzing pass of the Parquet
# reader (TRL_FUZZ_SECONDS, default 60), then the same unit tests built with AddressSanitizer + UndefinedBehaviorSanitizer. Set TRL_SKIP_SANITIZERS=1 to run only the first pass.
# The backend and model tests also run with oneDNN limited to AVX2 (ONEDNN_MAX_CPU_ISA), as on a CPU without
# AVX-512: bf16 GEMMs then take the widen-to-f32 path; TRL_NO_AVX512BF16=1 turns off the AVX512-BF16 decode kernel,
# TRL_NO_AMX=1 the AMX-BF16 one.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# Two test processes share the cores: OpenMP threads that spin while they wait for work starve the other
# process (measured: the SFT learning test takes 318 s beside another test, 165 s with passive waiting).
export OMP_WAIT_POLICY=PASSIVE

echo "== Release build (warnings are errors)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRL_WERROR=ON >/dev/null
cmake --build build
ctest --test-dir build --output-on-failure -j "$jobs"
echo "== the installed library: headers on their own, find_package(trl) and pkg-config consumers"
bash scripts/check-install.sh build
echo "== the Parquet reader under libFuzzer (clang, ASan + UBSan), ${TRL_FUZZ_SECONDS:-60} s from the seed corpus"
if ! TRL_FUZZ_BUILD=build-fuzz bash fuzz/run.sh "${TRL_FUZZ_SECONDS:-60}" > build-fuzz.log 2>&1; then
  tail -n 80 build-fuzz.log
  echo "fuzzing found a problem: the input is in crash-*/leak-*/timeout-*/oom-* (docs/TESTING.md, Fuzzing)"
  exit 1
fi
grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added)' build-fuzz.log
echo "== backend and model tests with oneDNN limited to AVX2 (no AVX-512, no bf16 GEMM)"
ONEDNN_MAX_CPU_ISA=AVX2 TRL_NO_AVX512BF16=1 TRL_NO_AMX=1 ctest --test-dir build --output-on-failure -j "$jobs" -R 'Cpu|OpTable|Golden|ProgramCache|Checkpointing|Generat'

if [ "${TRL_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer build"
  # -O1 -g1 (line tables for the reports' stack traces): half the compile time of RelWithDebInfo's -O2 -g, which
  # made this build the longest part of CI (docs/TESTING.md).
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DTRL_WERROR=ON -DTRL_SANITIZE=ON >/dev/null
  cmake --build build-asan
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs"
fi
echo "== all tests passed"
