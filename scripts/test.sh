#!/usr/bin/env bash
# Builds trl.cpp and runs every test: a Release build (GCC) with warnings as errors and every test, the installed
# library's consumers, the backend and model tests again as on a CPU without AVX-512, then a second build with clang,
# AddressSanitizer + UndefinedBehaviorSanitizer and libFuzzer's coverage: the tests again, and each fuzz target for
# TRL_FUZZ_SECONDS (default 20) from its corpus (TRL_SKIP_SANITIZERS=1 skips that build). Prints the time of each
# step at the end.
# The AVX2 pass runs the backend, kernel and model tests as on a CPU with AVX2 only: oneDNN limited to AVX2
# (ONEDNN_MAX_CPU_ISA), so bf16 GEMMs take the backend's own packed GEMM, and TRL_NO_AVX512=1, so the kernels this
# project dispatches itself (exponentials, bf16 SwiGLU, AdamW, the decode GEMV, AMX) take their AVX2 versions.
# On a CPU without AVX-512 the first pass already is that pass, and it is not run twice.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# Two test processes share the cores: OpenMP threads that spin while they wait for work starve the other
# process (measured: the SFT learning test takes 318 s beside another test, 165 s with passive waiting).
export OMP_WAIT_POLICY=PASSIVE

# step NAME: starts a timed step (and ends the one before).
times=() step_name="" step_start=$SECONDS
step() {
  if [ -n "$step_name" ]; then times+=("$(printf '%6d s  %s' $((SECONDS - step_start)) "$step_name")"); fi
  step_name=$1 step_start=$SECONDS
  [ -z "$step_name" ] || echo "== $step_name"
}

step "Release build (warnings are errors)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRL_WERROR=ON >/dev/null
cmake --build build
step "Release tests"
ctest --test-dir build --output-on-failure --no-tests=error -j "$jobs"
step "the Python package installed into a new virtual environment, one seed snippet run from there"
bash scripts/check-python-install.sh build
step "the installed library: headers on their own, find_package(trl) and pkg-config consumers"
bash scripts/check-install.sh build
if grep -qw avx512f /proc/cpuinfo; then
  step "backend, kernel and model tests as on an AVX2-only CPU (oneDNN capped at AVX2, TRL_NO_AVX512=1)"
  ONEDNN_MAX_CPU_ISA=AVX2 TRL_NO_AVX512=1 ctest --test-dir build --output-on-failure --no-tests=error -j "$jobs" -R 'Cpu|Vec|AdamW|OpTable|Golden|ProgramCache|Checkpointing|Generat|Cli.Env'
else
  echo "== this CPU has no AVX-512: the Release tests above were the AVX2 pass"
fi

if [ "${TRL_SKIP_SANITIZERS:-0}" != 1 ]; then
  step "clang build with AddressSanitizer + UndefinedBehaviorSanitizer and libFuzzer's coverage"
  # clang, where the Release build is GCC: a second compiler's warnings (as errors) and sanitizers, and one build for
  # both the sanitizer tests and the fuzz targets (TRL_FUZZ). -O1 -g1 (line tables for the reports' stack traces):
  # half the compile time of RelWithDebInfo's -O2 -g (docs/TESTING.md). The library and trl as a unity build (a third
  # less compile time; the Release build above compiles each file alone, so both ways are proven). The benchmarks
  # are not built: no test runs them.
  cmake -S . -B build-asan -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DTRL_WERROR=ON \
    -DTRL_SANITIZE=ON -DTRL_FUZZ=ON -DTRL_BUILD_BENCH=OFF -DTRL_UNITY_BUILD=ON >/dev/null
  cmake --build build-asan
  step "sanitizer tests (the long learning runs skip themselves: docs/TESTING.md)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure --no-tests=error -j "$jobs"
  # CTest runs a process per GoogleTest suite here (TRL_TEST_PER_SUITE, tests/CMakeLists.txt): count the tests.
  log=build-asan/Testing/Temporary/LastTest.log
  echo "== the sanitizer pass ran $(grep -hoE '^\[==========\] [0-9]+ tests? from' "$log" | awk '{s += $2} END {print s + 0}') tests," \
    "$(grep -hoE '^\[  SKIPPED \] [0-9]+ tests?, listed below' "$log" | awk '{s += $4} END {print s + 0}') of them skipped"
  step "every fuzz target under libFuzzer, ${TRL_FUZZ_SECONDS:-20} s each from its corpus (the sanitizer build)"
  if ! TRL_FUZZ_BUILD=build-asan bash fuzz/run.sh "${TRL_FUZZ_SECONDS:-20}" all > build-asan/fuzz.log 2>&1; then
    tail -n 80 build-asan/fuzz.log
    echo "fuzzing found a problem: the input is in crash-*/leak-*/timeout-*/oom-* (docs/TESTING.md, Fuzzing)"
    exit 1
  fi
  grep -E '^(== [a-z]+:|Done|stat::number_of_executed_units|stat::new_units_added)' build-asan/fuzz.log
fi
step ""
echo "== all tests passed; time per step:"
printf '%s\n' "${times[@]}"
printf '%6d s  in all\n' "$SECONDS"
