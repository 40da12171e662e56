#!/usr/bin/env bash
# The project's main job on a built-in default: builds trl (if needed), creates a tiny Qwen3 model,
# fine-tunes it on a small chat dataset (the loss falls), and asks it the questions it learned.
set -euo pipefail
cd "$(dirname "$0")/.."
# A build folder configured before (by scripts/test.sh, or CI's fresh-machine check) is used as it is.
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
# The build's progress, one short line per finished step ("[12/40] train/trainer.cpp"), so a slow build is not
# taken for a hung one; its whole output goes to build/demo-build.log, and to stderr when it fails.
if ! ninja -C build -n trl 2>/dev/null | grep -q 'no work to do'; then
  echo "demo: building trl (a few minutes on 2 cores; the full log is build/demo-build.log)"
fi
set +e
cmake --build build --target trl 2>&1 | tee build/demo-build.log |
  awk '/^\[[0-9]+\/[0-9]+\]/ { n = split($NF, p, "/"); printf "  %s %s\n", $1, (n > 1 ? p[n - 1] "/" : "") p[n]; fflush() }'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  cat build/demo-build.log >&2
  echo "demo: building trl failed (see above)" >&2
  exit 1
fi
./build/trl env
echo
./build/trl demo --out build/demo "$@"
