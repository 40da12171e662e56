#!/usr/bin/env bash
# The project's main job on a built-in default: builds trl (if needed), creates a tiny Qwen3 model,
# fine-tunes it on a small chat dataset (the loss falls), and asks it the questions it learned.
set -euo pipefail
cd "$(dirname "$0")/.."
# A build folder configured before (by scripts/test.sh, or CI's fresh-machine check) is used as it is.
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
# Quiet on success; on a failed build, its whole output (the compiler's errors) goes to stderr.
if ! log=$(cmake --build build --target trl 2>&1); then
  printf '%s\n' "$log" >&2
  echo "demo: building trl failed (see above)" >&2
  exit 1
fi
./build/trl env
echo
./build/trl demo --out build/demo "$@"
