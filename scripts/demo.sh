#!/usr/bin/env bash
# The project's main job on a built-in default: builds trl (if needed), creates a tiny Qwen3 model,
# fine-tunes it on a small chat dataset (the loss falls), and asks it the questions it learned.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x build/trl ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build build --target trl >/dev/null
./build/trl env
echo
./build/trl demo --out build/demo "$@"
